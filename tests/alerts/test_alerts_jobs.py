"""Real 3-rank Lightning jobs (gloo on CPU) alert a real HTTP server in another process: one
trigger per confirmed hang from the whole job, a resolve when a triggered event recovers,
nothing for a wait that recovers before confirmation; a dead endpoint costs the job nothing and
the alert stays in the event folder; the secrets are in no file and no log line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import watchdog.harness as harness
from alerts.servers import AlertServer, alert_server, refused_url
from watchdog.harness import STALL_EXIT_CODE

pytestmark = pytest.mark.timeout(300)
ALERT_JOB = Path(__file__).parent / "jobs" / "alert_job.py"
WEBHOOK_SECRET = "T0KEN-webhook-5ecret-9f3a"
ROUTING_SECRET = "R0UTING-key-5ecret-c41d"


@pytest.fixture
def alert_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's launchers run ``alert_job.py`` (the watchdog tests' job with alerts)."""
    monkeypatch.setattr(harness, "JOB", ALERT_JOB)


def _alerts_env(monkeypatch: pytest.MonkeyPatch, webhook_url: str, pd_url: str, command: str | None = None,
                deadline: float = 20.0, pause: str | None = None, attempt_timeout: float = 1.0,
                confirm: float = 10.0) -> None:
    config: dict[str, Any] = {"enabled": True, "webhook": {"url_env": "NCCLX_TEST_WEBHOOK_URL"},
                              "pagerduty": {"routing_key_env": "NCCLX_TEST_ROUTING_KEY", "endpoint": pd_url},
                              "command": command, "attempt_timeout_seconds": attempt_timeout, "attempts": 2,
                              "deadline_seconds": deadline, "confirm_seconds": confirm}
    monkeypatch.setenv("NCCLX_TEST_ALERTS", json.dumps(config))
    monkeypatch.setenv("NCCLX_TEST_WEBHOOK_URL", webhook_url)
    monkeypatch.setenv("NCCLX_TEST_ROUTING_KEY", ROUTING_SECRET)
    if pause:
        monkeypatch.setenv("NCCLX_TEST_PAUSE", pause)


def _assert_no_secret(tmp_path: Path, log: str, dump_dir: Path) -> None:
    assert WEBHOOK_SECRET not in log and ROUTING_SECRET not in log
    for path in [p for p in dump_dir.rglob("*") if p.is_file()]:
        data = path.read_bytes()
        assert WEBHOOK_SECRET.encode() not in data and ROUTING_SECRET.encode() not in data, path


def _one_event(result: harness.JobResult, prefix: str) -> Path:
    events = result.events(prefix)
    assert len(events) == 1, f"{events}\n{result.log[-6000:]}"
    return events[0]


def test_a_stuck_rank_pages_once_through_webhook_pagerduty_and_command(tmp_path: Path, alert_job: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    copies = tmp_path / "command-copies"
    copies.mkdir()
    with alert_server(tmp_path / "server") as server:
        _alerts_env(monkeypatch, server.url(f"/hook/{WEBHOOK_SECRET}"), server.url("/pd/v2/enqueue"),
                    command=f"cp -t {copies}")
        result = harness.run_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "1")
        assert result.returncode == STALL_EXIT_CODE, result.log[-6000:]
        folder = _one_event(result, "stall-")
        hooks, pds = server.posts("/hook/"), server.posts("/pd/")
    assert len(hooks) == 1 and len(pds) == 1, (hooks, pds, result.log[-4000:])
    hook = hooks[0]["body"]
    assert hooks[0]["content_type"] == "application/json"
    assert hook["action"] == "trigger" and hook["kind"] == "stuck_outside_collective"
    assert hook["culprit_ranks"] == [1] and hook["exit_code"] == STALL_EXIT_CODE
    assert "hang confirmed" in hook["text"] and "rank(s) 1" in hook["text"]
    assert hook["summary_json"] == str((folder / "summary.json").absolute())
    pd = pds[0]["body"]
    assert pd["routing_key"] == ROUTING_SECRET and pd["event_action"] == "trigger"
    assert pd["dedup_key"] == hook["dedup_key"] and pd["payload"]["severity"] == "critical"
    assert pd["payload"]["custom_details"]["culprit_ranks"] == [1]
    kept = json.loads((folder / "alert-trigger.json").read_text())
    assert {name: entry["state"] for name, entry in kept["sinks"].items()} == \
        {"webhook": "sent", "pagerduty": "sent", "command": "sent"}
    assert [p.name for p in copies.iterdir()] == ["alert-trigger.json"]
    _assert_no_secret(tmp_path, result.log, result.dump_dir)


def test_dead_endpoints_leave_the_exit_alone_and_the_alert_in_the_folder(tmp_path: Path, alert_job: None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Webhook: a server that never answers; PagerDuty: a refused port; command: exits 1. The job
    still ends with the stall's status; ``alerts resend`` delivers later from the folder."""
    with alert_server(tmp_path / "dead", "hang") as hanging:
        # an attempt may take 600 s: only the 4 s deadline bounds the exit
        _alerts_env(monkeypatch, hanging.url(f"/hook/{WEBHOOK_SECRET}"), refused_url("/pd"), command="false",
                    deadline=4.0, attempt_timeout=600.0)
        # ranks started by hand: the test waits for every rank, not only for the launching one
        result = harness.run_ranks_by_hand(tmp_path, 3, "--fault", "stuck_train", "--fault-rank", "1")
        assert result.returncode == STALL_EXIT_CODE, result.log[-6000:]
        assert len(hanging.posts("/hook/")) >= 1  # it was tried
    folder = _one_event(result, "stall-")
    path = folder / "alert-trigger.json"
    kept = json.loads(path.read_text())
    assert {name: entry["state"] for name, entry in kept["sinks"].items()} == \
        {"webhook": "failed", "pagerduty": "failed", "command": "failed"}
    assert "not delivered to webhook" in result.log and "alerts resend" in result.log
    _assert_no_secret(tmp_path, result.log, result.dump_dir)

    from lightning_ncclx.cli import main

    with alert_server(tmp_path / "later") as server:
        monkeypatch.setenv("NCCLX_TEST_WEBHOOK_URL", server.url(f"/hook/{WEBHOOK_SECRET}"))
        kept["sinks"]["pagerduty"]["settings"]["endpoint"] = server.url("/pd")
        kept["sinks"].pop("command")
        path.write_text(json.dumps(kept))
        assert main(["alerts", "resend", str(folder)]) == 0
        assert main(["alerts", "resend", str(folder)]) == 0  # already delivered: nothing sent twice
        assert len(server.posts("/hook/")) == 1 and len(server.posts("/pd")) == 1
        assert server.posts("/hook/")[0]["body"]["event"] == folder.name
    _assert_no_secret(tmp_path, result.log, result.dump_dir)


def test_a_wait_that_ends_before_confirmation_sends_nothing(tmp_path: Path, alert_job: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 waits 8 s after batch 4; the consensus starts an event at about 2 s, the hang
    would be confirmed at 25 s (the step threshold): the event recovers, nobody is paged."""
    with alert_server(tmp_path / "server") as server:
        _alerts_env(monkeypatch, server.url("/hook/x"), server.url("/pd"), pause="1,4,8")
        result = harness.run_job(tmp_path, "--on-stall", "dump", "--no-auto", "--train-step-seconds", "25",
                                 "--consensus-warmup", "2", "--batches", "20", "--step-sleep", "0.3")
        assert result.returncode == 0, result.log[-6000:]
        folder = _one_event(result, "stall-")
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["recovery"] and summary["recovery"]["recovered"], result.log[-4000:]
        assert server.posts() == []
    assert not list(folder.glob("alert-*.json"))


def test_a_confirmed_hang_that_then_recovers_sends_trigger_then_resolve(tmp_path: Path, alert_job: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 waits 16 s after batch 4; the step threshold (5 s) confirms the hang; then every
    rank moves on: a resolve with the trigger's dedup key follows."""
    with alert_server(tmp_path / "server") as server:
        _alerts_env(monkeypatch, server.url("/hook/x"), server.url("/pd"), pause="1,4,16")
        result = harness.run_job(tmp_path, "--on-stall", "dump", "--no-auto", "--train-step-seconds", "5",
                                 "--consensus-warmup", "2", "--batches", "24", "--step-sleep", "0.3")
        assert result.returncode == 0, result.log[-6000:]
        folder = _one_event(result, "stall-")
        pds = sorted(server.posts("/pd"), key=lambda row: row["time"])
        hooks = sorted(server.posts("/hook/"), key=lambda row: row["time"])
    assert [row["body"]["event_action"] for row in pds] == ["trigger", "resolve"], result.log[-4000:]
    assert pds[0]["body"]["dedup_key"] == pds[1]["body"]["dedup_key"]
    assert [row["body"]["action"] for row in hooks] == ["trigger", "resolve"]
    assert hooks[1]["body"]["recovered_after_seconds"] > 5.0
    assert hooks[0]["body"]["exit_code"] is None  # on_stall=dump: the job keeps waiting
    assert {p.name for p in folder.glob("alert-*.json")} == {"alert-trigger.json", "alert-resolve.json"}


def test_a_stall_pages_at_confirm_seconds_before_the_exit_bar(tmp_path: Path, alert_job: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 waits 16 s; the step threshold (40 s) would confirm the hang for an exit much later:
    the page goes out once the wait passed ``confirm_seconds`` (4 s), its resolve when it ends."""
    with alert_server(tmp_path / "server") as server:
        _alerts_env(monkeypatch, server.url("/hook/x"), server.url("/pd"), pause="1,4,16", confirm=4.0)
        result = harness.run_job(tmp_path, "--on-stall", "dump", "--no-auto", "--train-step-seconds", "40",
                                 "--consensus-warmup", "2", "--batches", "24", "--step-sleep", "0.3")
        assert result.returncode == 0, result.log[-6000:]
        _one_event(result, "stall-")
        hooks = sorted(server.posts("/hook/"), key=lambda row: row["time"])
    assert [row["body"]["action"] for row in hooks] == ["trigger", "resolve"], result.log[-4000:]


def test_a_sigkilled_culprit_still_pages_exactly_once(tmp_path: Path, alert_job: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 2 is SIGKILLed mid-step: both other ranks raise, one exception event is summarized
    and confirmed at once: one trigger from the whole job."""
    with alert_server(tmp_path / "server") as server:
        _alerts_env(monkeypatch, server.url("/hook/x"), server.url("/pd"))
        result = harness.run_ranks_by_hand(tmp_path, 3, "--fault", "die", "--fault-rank", "2",
                                           "--strategy", "ddp_ncclx")
        assert result.returncode is not None, result.log[-6000:]
        folder = _one_event(result, "exception-")
        hooks, pds = server.posts("/hook/"), server.posts("/pd")
    assert len(hooks) == 1 and len(pds) == 1, (hooks, pds, result.log[-4000:])
    assert hooks[0]["body"]["culprit_ranks"] == [2] and hooks[0]["body"]["reason"] == "exception"
    assert (folder / "alert-trigger.json").is_file()


@pytest.mark.parametrize("noticer", [2, 0], ids=["another_rank", "the_store_host"])
def test_a_sender_sigkilled_as_it_sends_is_taken_over_by_one_other_rank(tmp_path: Path, alert_job: None,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         noticer: int) -> None:
    """Rank 1 is stuck; the rank that summarized the stall is SIGKILLed at the moment it would
    deliver the trigger (the file is written, every sink pending). A surviving rank on the host
    sees the sender's process gone, claims the takeover and sends: exactly one trigger arrives.
    Where the sender is rank 0, the store's host, its death takes the store with it: the alert
    file alone decides the takeover, and every other rank still leaves through the event (the
    summarizing rank seen gone in ``/proc``), not after the event's whole give-up window."""
    marker = tmp_path / "killed-sender"
    with alert_server(tmp_path / "server") as server:
        _alerts_env(monkeypatch, server.url("/hook/x"), server.url("/pd"), confirm=4.0)
        monkeypatch.setenv("NCCLX_TEST_KILL_SENDER", str(marker))
        result = harness.run_ranks_by_hand(tmp_path, 3, "--fault", "stuck_train", "--fault-rank", "1",
                                           "--noticer-rank", str(noticer), "--slow-rank-threshold", "30", timeout=200.0)
        assert marker.is_file(), result.log[-6000:]
        killed = int(marker.read_text())
        folder = _one_event(result, "stall-")
        hooks, pds = server.posts("/hook/"), server.posts("/pd")
    assert len(hooks) == 1 and len(pds) == 1, (hooks, pds, result.log[-6000:])
    assert hooks[0]["body"]["action"] == "trigger" and hooks[0]["body"]["culprit_ranks"] == [1]
    assert pds[0]["body"]["dedup_key"] == hooks[0]["body"]["dedup_key"]
    kept = json.loads((folder / "alert-trigger.json").read_text())
    assert {name: entry["state"] for name, entry in kept["sinks"].items()} == {"webhook": "sent", "pagerduty": "sent"}
    senders = {entry["sender"]["rank"] for entry in kept["sinks"].values()}
    assert len(senders) == 1 and killed not in senders, (kept, killed)
    assert {entry["taken_over_from"] for entry in kept["sinks"].values()} == {killed}
    # a rank of its host (its process seen gone) or a watcher of the job-wide claim (left unchanged): one of them
    takeovers = result.log.count("whose process is gone: sending it") + result.log.count("has a holder that is gone")
    assert takeovers == 1, result.log[-6000:]
    if noticer == 0:
        assert killed == 0 and result.returncode == STALL_EXIT_CODE, result.log[-6000:]
        # rank 1, stuck in its own code, leaves at its own bar (rank 0's process seen gone in /proc,
        # or its store refused); rank 2, in gloo's all_reduce, may leave by the error rank 0's end raises
        assert any(f"[rank 1] stall-001: {line}" in result.log for line in (
            "the summarizing rank 0 is gone without saying how the event ended",
            "the job's store is gone, so no word on how the event ended can come")), result.log[-6000:]
        assert "never said how the event ended" not in result.log
