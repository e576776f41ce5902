"""Taking over an alert whose sender died while sending: the sender is a real process of this
host (started here, then SIGKILLed), the endpoint a real server in another process. A live
sender is never taken over; of several notifiers that find the same orphaned alert, one sends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from alerts.servers import alert_server
from lightning_ncclx.alerts import AlertNotifier
from lightning_ncclx.alerts.outbox import read_alert, write_alert
from lightning_ncclx.config import AlertsConfig, WebhookAlertConfig

DOCUMENT = {"schema": "lightning-ncclx/alert/1", "action": "trigger", "dedup_key": "k-7", "text": "t",
            "event": "stall-001"}
SENDER = ("import json, sys; from lightning_ncclx.alerts.sender import sender_record; "
          "print(json.dumps(sender_record(2)), flush=True); sys.stdin.read()")


@pytest.fixture
def sender() -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """A process that names itself as a sender (rank 2), then waits until killed."""
    proc = subprocess.Popen([sys.executable, "-c", SENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        record = json.loads(proc.stdout.readline())
        assert record is not None, "this host's /proc cannot tell a process's liveness"
        yield proc, record
    finally:
        proc.kill()
        proc.wait()


def _pending_alert(folder: Path, record: dict[str, Any]) -> Path:
    folder.mkdir(parents=True)
    path = folder / "alert-trigger.json"
    write_alert(path, DOCUMENT, {"webhook": {"settings": {"url_env": "HOOK_URL"}, "state": "pending",
                                             "sender": record}})
    return path


def _notifier() -> AlertNotifier:
    return AlertNotifier(AlertsConfig(enabled=True, webhook=WebhookAlertConfig(url_env="HOOK_URL")), rank=0)


def test_a_live_sender_is_left_alone_a_dead_one_is_taken_over_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   sender: tuple[subprocess.Popen[str], dict]) -> None:
    proc, record = sender
    folder = tmp_path / "stall-001"
    path = _pending_alert(folder, record)
    with alert_server(tmp_path / "srv") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        first, second = _notifier(), _notifier()
        assert first.take_over(folder) == []  # alive: it may still be sending
        proc.kill()
        proc.wait()
        taken = [first.take_over(folder), second.take_over(folder), first.take_over(folder)]
        first.drain()
        second.drain()
        posts = server.posts()
    assert taken == [[path], [], []]
    assert len(posts) == 1 and posts[0]["body"]["dedup_key"] == "k-7"
    _, sinks = read_alert(path)
    assert sinks["webhook"]["state"] == "sent" and sinks["webhook"]["taken_over_from"] == 2
    assert sinks["webhook"]["sender"]["pid"] != record["pid"] and sinks["webhook"]["sender"]["generation"] == 1
    assert (folder / ".alert-trigger.json.takeover-1").exists()


def test_a_sent_or_failed_sink_is_not_taken_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 sender: tuple[subprocess.Popen[str], dict]) -> None:
    proc, record = sender
    proc.kill()
    proc.wait()
    folder = tmp_path / "stall-002"
    folder.mkdir()
    write_alert(folder / "alert-trigger.json", DOCUMENT, {
        "webhook": {"settings": {"url_env": "HOOK_URL"}, "state": "sent", "sender": record},
        "pagerduty": {"settings": {"routing_key_env": "K", "endpoint": "http://127.0.0.1:9/"}, "state": "failed",
                      "sender": record}})
    with alert_server(tmp_path / "srv") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        notifier = _notifier()
        assert notifier.take_over(folder) == []
        assert server.posts() == []
