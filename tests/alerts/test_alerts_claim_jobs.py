"""Real 3-rank jobs (gloo on CPU, a real TCPStore) in which every rank is a host of its own: each
runs in its own pid namespace (``unshare --pid --fork --mount-proc``), so no rank can see another's
``/proc``, as on three machines. Rank 2 summarizes the stall of rank 1 and is SIGKILLed before it
claims the trigger, or as it sends it; a rank of another "host" sends it in its place, from the
job-wide claim in the store: exactly one trigger arrives at a real HTTP server. The others leave
by the exit order where the summarizing rank wrote it before it died, else once its sign of life
in the store stopped, not at the end of the event's window."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import watchdog.harness as harness
from alerts.servers import alert_server
from support import clean_env, kill_session, start_job

pytestmark = pytest.mark.timeout(400)
ALERT_JOB = Path(__file__).parent / "jobs" / "alert_job.py"
WORLD = 3
STALL_ARGS = ("--fault", "stuck_train", "--fault-rank", "1", "--slow-rank-threshold", "6",
              "--train-step-seconds", "3", "--no-auto", "--no-consensus")
HOST_OF_ITS_OWN = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", '"$@"; exit $?', "host"]
"""A rank's own pid namespace; ``sh`` is its pid 1, so the rank can SIGKILL itself."""


def _namespaces_unavailable() -> str | None:
    if shutil.which("unshare") is None:
        return "util-linux's `unshare` is not installed"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"no pid namespace here: {probe.stderr.decode(errors='replace')[:200]}"


@pytest.fixture(scope="module")
def separate_hosts() -> None:
    reason = _namespaces_unavailable()
    if reason:
        pytest.skip(reason)


def _alerts_env(webhook_url: str, pd_url: str, **overrides: Any) -> dict[str, str]:
    config: dict[str, Any] = {"enabled": True, "webhook": {"url_env": "NCCLX_TEST_WEBHOOK_URL"},
                              "pagerduty": {"routing_key_env": "NCCLX_TEST_ROUTING_KEY", "endpoint": pd_url},
                              "attempt_timeout_seconds": 1.0, "attempts": 2, "deadline_seconds": 4.0,
                              "confirm_seconds": 4.0, **overrides}
    return {"NCCLX_TEST_ALERTS": json.dumps(config), "NCCLX_TEST_WEBHOOK_URL": webhook_url,
            "NCCLX_TEST_ROUTING_KEY": "routing-key"}


def _rank_processes(session: int) -> list[int]:
    """The job's own processes in one rank's session (not ``unshare`` and its ``sh``, which stand
    for the host and pass the rank's exit status on)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == session and str(ALERT_JOB).encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return pids


def _wait_as_a_launcher_that_ends_every_rank(procs: list[subprocess.Popen[bytes]], timeout: float,
                                             grace: float) -> list[int | None]:
    """What ``srun --kill-on-bad-exit`` and torchrun's agent do: once one rank exits, every other
    rank gets SIGTERM, and SIGKILL ``grace`` seconds later."""
    start = time.monotonic()
    terminated_at: float | None = None
    while time.monotonic() - start < timeout and any(proc.poll() is None for proc in procs):
        if terminated_at is None and any(proc.poll() is not None for proc in procs):
            terminated_at = time.monotonic()
            for proc in procs:
                if proc.poll() is None:
                    for pid in _rank_processes(proc.pid):
                        try:
                            os.kill(pid, signal.SIGTERM)
                        except ProcessLookupError:
                            pass
        if terminated_at is not None and time.monotonic() - terminated_at >= grace:
            for proc in procs:
                kill_session(proc)
        time.sleep(0.1)
    return [proc.poll() for proc in procs]


def _run_on_separate_hosts(tmp_path: Path, extra_env: dict[str, str], timeout: float = 300.0,
                           noticer: int = 2, launcher_grace: float | None = None) -> harness.JobResult:
    """Every rank started by hand in its own pid namespace; ``returncode``: the highest exit code.
    ``launcher_grace``: the ranks are ended as by a launcher that ends every rank once one exits
    (SIGTERM, then SIGKILL that many seconds later)."""
    dump_dir = tmp_path / "dumps"
    port = str(harness.free_port())
    procs, logs = [], []
    try:
        for rank in range(WORLD):
            env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "LOCAL_RANK": str(rank),
                             "NODE_RANK": "0", "WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1", **extra_env})
            logs.append(tmp_path / f"rank{rank}.log")
            argv = [*HOST_OF_ITS_OWN, sys.executable, str(ALERT_JOB), "--dump-dir", str(dump_dir),
                    "--devices", str(WORLD), *STALL_ARGS, "--noticer-rank", str(noticer)]
            procs.append(start_job(argv, env=env, cwd=tmp_path, log=logs[-1]))
        codes: list[int | None] = []
        if launcher_grace is not None:
            codes = _wait_as_a_launcher_that_ends_every_rank(procs, timeout, launcher_grace)
        for proc in procs[len(codes):]:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for proc in procs:
            kill_session(proc)
            proc.wait()
    text = "\n".join(f"[rank {r} log]\n" + path.read_text(errors="replace") for r, path in enumerate(logs))
    return harness.JobResult(None if None in codes else max(codes), text, dump_dir)


def _one_trigger_from_another_host(result: harness.JobResult, server: Any, killed: int) -> dict[str, Any]:
    body = _the_one_trigger_sent_in_place_of(result, server, killed)
    # a rank that left without the summarizing rank's word found it gone by its sign of life (no
    # /proc of its host to read), not at the end of the event's window; killed as it sends, the
    # summarizing rank may have written the exit order first (then the others leave by it)
    if "is gone without saying how the event ended" in result.log:
        assert "the summarizing rank 2 has given no sign of life" in result.log, result.log[-8000:]
    else:
        assert all(f"[rank {r}] stall-001: on_stall=dump_and_exit, exiting with code 75" in result.log
                   for r in (0, 1)), result.log[-8000:]
    return body


def _the_one_trigger_sent_in_place_of(result: harness.JobResult, server: Any, killed: int) -> dict[str, Any]:
    """One webhook post and one PagerDuty event, of the job's one stall, sent by one rank that
    took the claim over from ``killed``; the webhook's body."""
    events = result.events("stall-")
    assert len(events) == 1, f"{events}\n{result.log[-6000:]}"
    hooks, pds = server.posts("/hook/"), server.posts("/pd/")
    assert len(hooks) == 1 and len(pds) == 1, (hooks, pds, result.log[-8000:])
    hook = hooks[0]
    assert hook["body"]["action"] == "trigger" and hook["body"]["event"] == events[0].name
    assert hook["body"]["culprit_ranks"] == [1], hook["body"]
    assert hook["idempotency_key"] == hook["body"]["alert_id"]
    assert pds[0]["body"]["dedup_key"] == hook["body"]["dedup_key"]
    assert result.log.count("is gone (its claim unchanged") == 1, result.log[-8000:]
    kept = json.loads((events[0] / "alert-trigger.json").read_text())
    senders = {entry["sender"]["rank"] for entry in kept["sinks"].values()}
    assert len(senders) == 1 and killed not in senders, (kept, killed)
    assert {entry.get("taken_over_from") for entry in kept["sinks"].values()} == {killed}, kept
    assert {entry["state"] for entry in kept["sinks"].values()} == {"sent"}
    return hook["body"]


def test_a_summarizing_rank_killed_before_it_claims_is_replaced_by_a_rank_of_another_host(
        tmp_path: Path, separate_hosts: None) -> None:
    marker = tmp_path / "killed-before-claim"
    with alert_server(tmp_path / "server") as server:
        env = _alerts_env(server.url("/hook/x"), server.url("/pd/v2/enqueue"))
        result = _run_on_separate_hosts(tmp_path, {**env, "NCCLX_TEST_KILL_BEFORE_CLAIM": str(marker)})
        assert marker.is_file(), result.log[-8000:]
        killed = int(marker.read_text())
        assert killed == 2, result.log[-8000:]
        body = _one_trigger_from_another_host(result, server, killed)
    # the summarizing rank's own document, armed in the store with the summary: its kind and culprit
    assert body["kind"] == "stuck_outside_collective" and "hang confirmed" in body["text"]


def test_a_summarizing_rank_killed_as_it_sends_is_replaced_by_a_rank_of_another_host(
        tmp_path: Path, separate_hosts: None) -> None:
    marker = tmp_path / "killed-sender"
    with alert_server(tmp_path / "server") as server:
        env = _alerts_env(server.url("/hook/x"), server.url("/pd/v2/enqueue"))
        result = _run_on_separate_hosts(tmp_path, {**env, "NCCLX_TEST_KILL_SENDER": str(marker)})
        assert marker.is_file(), result.log[-8000:]
        killed = int(marker.read_text())
        assert killed == 2, result.log[-8000:]
        _one_trigger_from_another_host(result, server, killed)
    assert "whose process is gone: sending it" not in result.log  # no rank shares the sender's /proc


def test_under_a_launcher_that_ends_every_rank_a_sender_killed_on_another_host_is_replaced_in_its_grace(
        tmp_path: Path, separate_hosts: None) -> None:
    """``srun --kill-on-bad-exit``, torchrun's agent, Kubernetes: once the summarizing rank is
    SIGKILLed as it sends, every other rank gets SIGTERM and, here, SIGKILL 20 s later (the
    usual grace is 30 s). At the default ``deadline_seconds`` (20 s) a silent claim would be taken
    over only after 25 s; the summarizing rank's claim beats, so a rank of another host takes it
    over ``LEASE_SECONDS`` after its last beat, inside the grace: exactly one trigger arrives."""
    marker = tmp_path / "killed-sender"
    with alert_server(tmp_path / "server") as server:
        env = _alerts_env(server.url("/hook/x"), server.url("/pd/v2/enqueue"), deadline_seconds=20.0)
        result = _run_on_separate_hosts(tmp_path, {**env, "NCCLX_TEST_KILL_SENDER": str(marker)},
                                        launcher_grace=20.0)
        assert marker.is_file(), result.log[-8000:]
        assert int(marker.read_text()) == 2, result.log[-8000:]
        _the_one_trigger_sent_in_place_of(result, server, killed=2)
        received = server.posts("/hook/")[0]["time"]
    print(f"sender killed -> trigger received: {received - marker.stat().st_mtime:.1f} s")


def test_a_summarizing_rank_that_served_the_store_alone_on_its_host_killed_as_it_sends_is_replaced(
        tmp_path: Path, separate_hosts: None) -> None:
    """Rank 0 summarizes and is SIGKILLed as it sends: the job's store goes with it, so no claim
    can be read or made, and no rank shares its host to take over from the alert file. The
    event's meta said it served the store alone on its host: the event's first watcher (rank 1),
    its own heartbeat confirming the hang, sends the trigger, and nobody else; it leaves once
    stuck past its own threshold, not after the event's whole window."""
    marker = tmp_path / "killed-sender"
    with alert_server(tmp_path / "server") as server:
        env = _alerts_env(server.url("/hook/x"), server.url("/pd/v2/enqueue"))
        result = _run_on_separate_hosts(tmp_path, {**env, "NCCLX_TEST_KILL_SENDER": str(marker)}, noticer=0)
        assert marker.is_file(), result.log[-8000:]
        assert int(marker.read_text()) == 0, result.log[-8000:]
        events = result.events("stall-")
        assert len(events) == 1, f"{events}\n{result.log[-6000:]}"
        hooks, pds = server.posts("/hook/"), server.posts("/pd/")
    assert len(hooks) == 1 and len(pds) == 1, (hooks, pds, result.log[-8000:])
    body = hooks[0]["body"]
    assert body["action"] == "trigger" and body["event"] == events[0].name, body
    assert pds[0]["body"]["dedup_key"] == body["dedup_key"]
    assert result.log.count("alone on the store's host: sending its trigger alert") == 1, result.log[-8000:]
    assert "[rank 1] the job's store is gone, and with it rank 0" in result.log, result.log[-8000:]
    kept = json.loads((events[0] / "alert-trigger.json").read_text())
    assert {entry["sender"]["rank"] for entry in kept["sinks"].values()} == {1}, kept
    assert {entry["state"] for entry in kept["sinks"].values()} == {"sent"}, kept
    # rank 1, stuck in its own code, leaves at its own bar, or by the exit order where rank 0 wrote
    # it before it died (killed as it sends: on a loaded machine the confirmation may come first);
    # rank 2 waits in gloo's all_reduce, which may raise first once rank 0's connection closes
    # (then it leaves by that exception)
    assert ("[rank 1] stall-001: the job's store is gone, so no word on how the event ended can come" in result.log
            or "[rank 1] stall-001: on_stall=dump_and_exit, exiting with code 75" in result.log), result.log[-8000:]
    assert "never said how the event ended" not in result.log, result.log[-8000:]
