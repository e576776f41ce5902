"""Delivery to real endpoints in another process: retries with backoff, one thread per sink
(a hanging endpoint does not hold up the others), every outcome in the alert file, the secret
in neither the file nor the log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from alerts.servers import alert_server
from lightning_ncclx.alerts.delivery import Policy, deliver
from lightning_ncclx.alerts.outbox import BadAlertFile, claim, read_alert, unsent, write_alert
from lightning_ncclx.alerts.sinks import PagerDutySink, WebhookSink

SECRET = "w3bhook-5ECRET-31"
DOCUMENT = {"action": "trigger", "dedup_key": "k", "text": "t", "event": "stall-001"}


def test_a_failing_endpoint_is_retried_then_recorded_as_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "alert-trigger.json"
    with alert_server(tmp_path / "srv", "error") as server:
        monkeypatch.setenv("HOOK_URL", server.url(f"/{SECRET}"))
        entries: dict = {}
        with caplog.at_level(logging.WARNING):
            failed = deliver(path, DOCUMENT, [WebhookSink("HOOK_URL")], entries, Policy(2.0, 3, 30.0))
        assert len(server.posts()) == 3
    assert failed == ["webhook"]
    document, sinks = read_alert(path)
    assert document == DOCUMENT
    assert sinks["webhook"]["state"] == "failed" and sinks["webhook"]["error"] == "HTTP 500"
    assert sinks["webhook"]["attempts"] == 3 and sinks["webhook"]["settings"] == {"url_env": "HOOK_URL"}
    assert SECRET not in path.read_text() and SECRET not in caplog.text
    assert "lightning-ncclx alerts resend" in caplog.text


def test_a_hanging_endpoint_does_not_hold_up_the_other_sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "alert-trigger.json"
    monkeypatch.setenv("PD_KEY", SECRET)
    with alert_server(tmp_path / "hang", "hang") as hanging, alert_server(tmp_path / "ok") as ok:
        monkeypatch.setenv("HOOK_URL", hanging.url("/hook"))
        failed = deliver(path, DOCUMENT, [WebhookSink("HOOK_URL"), PagerDutySink("PD_KEY", ok.url("/pd"))], {},
                         Policy(30.0, 1, 2.0))
        assert len(ok.posts("/pd")) == 1
    assert failed == ["webhook"]
    _, sinks = read_alert(path)
    assert sinks["pagerduty"]["state"] == "sent"
    assert sinks["webhook"]["state"] == "failed"
    assert "deadline" in sinks["webhook"]["error"] or "timed out" in sinks["webhook"]["error"]
    assert SECRET not in path.read_text()


def test_only_the_first_claim_of_an_alert_file_wins(tmp_path: Path) -> None:
    path = tmp_path / "alert-trigger.json"
    assert claim(path) and not claim(path)


@pytest.mark.parametrize(("content", "why"), [
    (b"\x80\x03pickle", "not JSON"),
    (b'{"document": {"action": "page"}, "sinks": {}}', "not an alert file"),
    (b"[1, 2]", "not an alert file"),
    (b'{"document": {"action": "trigger"}, "sinks": {"webhook": 3}}', "not an alert file"),
])
def test_a_bad_alert_file_is_named_not_read(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "alert-trigger.json"
    path.write_bytes(content)
    with pytest.raises(BadAlertFile, match=why):
        read_alert(path)


def test_unsent_lists_every_sink_not_delivered(tmp_path: Path) -> None:
    path = tmp_path / "alert-resolve.json"
    write_alert(path, dict(DOCUMENT, action="resolve"), {"webhook": {"state": "sent"}, "pagerduty": {"state": "failed"},
                                                         "command": {"state": "pending"}})
    assert unsent(read_alert(path)[1]) == ["pagerduty", "command"]
    assert json.loads(path.read_text())["document"]["action"] == "resolve"
