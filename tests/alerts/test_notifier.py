"""The notifier of one rank: one trigger per event folder, a resolve only after a trigger, the
alert file written before the first attempt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from alerts.servers import alert_server
from lightning_ncclx.alerts import AlertNotifier
from lightning_ncclx.config import AlertsConfig, WebhookAlertConfig


def _summary(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "hang_kind": "rank_lost", "headline": "rank 3 is gone", "culprit_ranks": [3], "hosts": {"3": "node-b"},
        "advice": ["look at node-b's kernel log", "then the rest"], "op": "all_reduce", "collective_seq_id": 9,
        "restart_advice": {"action": "restart_excluding_hosts", "hosts_to_exclude": ["node-b"]},
        "process_group": {"name": "0", "desc": "default_pg", "backend": "nccl", "ranks": [0, 1, 2, 3]},
        "incident": {"run_id": "run-7"}}))


def test_one_trigger_per_event_and_its_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "dumps" / "stall-001"
    _summary(folder)
    with alert_server(tmp_path / "srv") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        notifier = AlertNotifier(AlertsConfig(enabled=True, webhook=WebhookAlertConfig(url_env="HOOK_URL")))
        notifier.resolve(folder, event="stall-001", lasted_seconds=3.0)  # no trigger yet: nothing
        notifier.trigger(folder, event="stall-001", reason="stall", exit_code=75)
        notifier.trigger(folder, event="stall-001", reason="stall", exit_code=75)
        notifier.drain()
        notifier.resolve(folder, event="stall-001", lasted_seconds=42.5)
        notifier.drain()
        posts = [row["body"] for row in sorted(server.posts(), key=lambda row: row["time"])]
    assert [p["action"] for p in posts] == ["trigger", "resolve"]
    trigger, resolve = posts
    assert trigger["kind"] == "rank_lost" and trigger["culprit_hosts"] == ["node-b"] and trigger["exit_code"] == 75
    assert trigger["advice"] == "look at node-b's kernel log" and trigger["run_id"] == "run-7"
    assert trigger["restart_advice"]["hosts_to_exclude"] == ["node-b"]
    assert trigger["process_group"] == {"name": "0", "desc": "default_pg", "backend": "nccl"}
    assert "rank 3 is gone" in trigger["text"] and "node-b" in trigger["text"]
    assert resolve["dedup_key"] == trigger["dedup_key"] and resolve["recovered_after_seconds"] == 42.5


def test_an_event_without_summary_still_alerts_with_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "exception-001"
    folder.mkdir()
    with alert_server(tmp_path / "srv") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        notifier = AlertNotifier(AlertsConfig(enabled=True, webhook=WebhookAlertConfig(url_env="HOOK_URL")))
        notifier.trigger(folder, event="exception-001", reason="exception", exit_code=None)
        notifier.drain()
        (post,) = server.posts()
    assert post["body"]["kind"] == "unknown" and str(folder) in post["body"]["text"]


def test_the_alert_file_is_there_before_delivery_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process killed while sending leaves its alert for ``alerts resend``."""
    folder = tmp_path / "stall-002"
    _summary(folder)
    with alert_server(tmp_path / "srv", "hang") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        notifier = AlertNotifier(AlertsConfig(enabled=True, webhook=WebhookAlertConfig(url_env="HOOK_URL"),
                                              deadline_seconds=30.0, attempt_timeout_seconds=30.0, attempts=1))
        notifier.trigger(folder, event="stall-002", reason="stall", exit_code=None)
        kept = json.loads((folder / "alert-trigger.json").read_text())
    notifier.drain()  # the server is gone: the one attempt ends, no thread outlives the test
    assert kept["sinks"]["webhook"]["state"] == "pending" and kept["document"]["action"] == "trigger"


def test_a_resolve_waits_for_its_trigger_still_being_sent(tmp_path: Path) -> None:
    """A site command that takes a second per alert: the resolve, asked for while the trigger is
    still being delivered, starts only once the trigger's delivery ended (PagerDuty would open an
    incident that a resolve sent first never closes)."""
    journal = tmp_path / "journal"
    hook = (f"{sys.executable} -c \"import sys, time, pathlib; name = pathlib.Path(sys.argv[-1]).stem; "
            f"j = open({str(journal)!r}, 'a'); j.write(name + ' start\\n'); j.flush(); time.sleep(1.0); "
            f"j.write(name + ' end\\n')\"")
    folder = tmp_path / "stall-003"
    _summary(folder)
    notifier = AlertNotifier(AlertsConfig(enabled=True, command=hook, deadline_seconds=10.0))
    notifier.trigger(folder, event="stall-003", reason="stall", exit_code=None)
    notifier.resolve(folder, event="stall-003", lasted_seconds=1.0)
    notifier.drain()
    assert journal.read_text().splitlines() == ["alert-trigger start", "alert-trigger end",
                                                "alert-resolve start", "alert-resolve end"]


def test_two_hosts_sending_one_events_trigger_give_it_one_dedup_key(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The summarizing rank sent its trigger and died before its claim said so; a rank of another
    host, whose dump folder has another path and no summary, sends it again. Both carry the key
    made from the run, the event and the event meta's opening time, which every rank reads alike:
    PagerDuty keeps one incident. Another event opened at another time has its own key."""
    opened = 1_765_000_000.123
    summarized = tmp_path / "node-a" / "ncclx" / "run-7" / "stall-001"
    _summary(summarized)
    elsewhere = tmp_path / "node-b" / "scratch" / "run-7" / "stall-001"
    elsewhere.mkdir(parents=True)
    with alert_server(tmp_path / "srv") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        config = AlertsConfig(enabled=True, webhook=WebhookAlertConfig(url_env="HOOK_URL"))
        for folder in (summarized, elsewhere):
            notifier = AlertNotifier(config)
            notifier.trigger(folder, event="stall-001", reason="stall", exit_code=75, opened=opened)
            notifier.drain()
        later = AlertNotifier(config)
        (elsewhere.parent / "stall-002").mkdir()
        later.trigger(elsewhere.parent / "stall-002", event="stall-002", reason="stall", exit_code=75,
                      opened=opened + 600)
        later.drain()
        keys = [row["body"]["dedup_key"] for row in sorted(server.posts(), key=lambda row: row["time"])]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2], keys
    assert keys[0].startswith("lightning-ncclx/run-7/stall-001/")
