"""Ranks that leave or come back in the middle of an event, in real 4-rank jobs started by hand
(no launcher that kills the job when one rank dies): a rank killed right after it announced its
digest, and a rank stopped through the whole event and resumed after the summary was written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support import clean_env, contexts, free_port, kill_session, start_job
from watchdog.harness import JOB, STALL_EXIT_CODE, assert_culprit, wait_for

pytestmark = pytest.mark.timeout(300)
WORLD = 4


class Ranks:
    """The ranks of one job, each its own process (``LOCAL_RANK`` set: Lightning launches nothing)."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.dump_dir = tmp_path / "dumps"
        port = str(free_port())
        self.logs = [tmp_path / f"rank{rank}.log" for rank in range(WORLD)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(WORLD):
            env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "LOCAL_RANK": str(rank),
                             "NODE_RANK": "0", "WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1"})
            self.procs.append(start_job([sys.executable, str(JOB), "--dump-dir", str(self.dump_dir), "--devices",
                                         str(WORLD), *args], env=env, cwd=tmp_path, log=self.logs[rank]))

    def wait(self, timeout: float = 180.0) -> list[int | None]:
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def stop(self) -> None:
        for proc in self.procs:
            kill_session(proc)  # SIGKILL ends a stopped process too
            proc.wait()

    def log(self, rank: int | None = None) -> str:
        ranks = range(WORLD) if rank is None else [rank]
        return "\n".join(f"[rank {r} log]\n" + self.logs[r].read_text(errors="replace") for r in ranks)

    def summarized(self) -> list[Path]:
        try:
            return sorted(p.parent for p in self.dump_dir.rglob("summary.json") if p.parent.parent.name != "ranks")
        except FileNotFoundError:  # a rank's run scope removed the folder it made while it was still empty
            return []


def test_a_rank_killed_after_announcing_its_digest_is_not_waited_for(tmp_path: Path) -> None:
    """Rank 1 sleeps in training_step; rank 0 notices, starts the event and gathers in two phases.
    Rank 2 announces its digest and is SIGKILLed before the initiator asks it for its full dump:
    its digest stands in for it, the initiator stops waiting once a rank of its host finds the
    process gone (not after collect_timeout_seconds), and every other rank leaves with the
    kind's exit status."""
    job = Ranks(tmp_path, "--fault", "stuck_train", "--fault-rank", "1", "--noticer-rank", "0",
                "--slow-rank-threshold", "4", "--die-after-announce", "2", "--strategy", "ddp_ncclx", "--node-local",
                "--two-phase")  # the others' threshold: a little above rank 0's, so rank 0 starts the event
    try:
        codes = job.wait()
    finally:
        job.stop()
    log = job.log()
    assert codes == [STALL_EXIT_CODE, STALL_EXIT_CODE, -signal.SIGKILL, STALL_EXIT_CODE], f"{codes}\n{log[-6000:]}"
    assert "[rank 2] killed after announcing its dump" in log
    folders = job.summarized()
    assert len(folders) == 1, f"{folders}\n{log[-6000:]}"
    summary = assert_culprit(folders[0], 1, log)
    assert (summary["verdict"], summary["hang_kind"]) == ("not_entered", "stuck_outside_collective")
    collection = json.loads((folders[0] / "collection.json").read_text())
    assert collection["gather"] == "two_phase" and collection["missing_ranks"] == [], collection
    assert 2 in collection["digest_only_ranks"] and 1 not in collection["digest_only_ranks"], collection
    assert "rank(s) [2] gone: their digests stand in for them" in log, log[-6000:]
    assert "no full dump from rank(s) [2] within" not in log  # not waited for until the deadline


def test_a_rank_resumed_after_the_summary_joins_no_closed_event_and_leaves_no_key(tmp_path: Path) -> None:
    """Rank 2 SIGSTOPs itself mid-step, so the event (rank 0 notices; on_stall dump) is summarized
    without it: alive, state T. Then it is resumed (SIGCONT): its doorbell rang long ago, but the
    event is closed, so it neither dumps into it nor adds keys; training goes on to the end."""
    job = Ranks(tmp_path, "--fault", "freeze", "--fault-rank", "2", "--noticer-rank", "0", "--on-stall", "dump",
                "--strategy", "ddp_ncclx", "--node-local", "--report-store-keys")
    try:
        assert wait_for(lambda: bool(job.summarized()), 150), job.log()[-6000:]
        folder = job.summarized()[0]
        # closed, not only summarized: resumed between the two, rank 2 would still join the event
        assert wait_for(lambda: f"{folder.name} is closed" in job.log(0), 60), job.log(0)[-6000:]
        assert job.procs[2].poll() is None  # still there, stopped
        os.kill(job.procs[2].pid, signal.SIGCONT)
        codes = job.wait()
    finally:
        job.stop()
    log = job.log()
    assert codes == [0] * WORLD, f"{codes}\n{log[-6000:]}"
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["missing_ranks"] == [2] and collection["silent_ranks"]["2"]["state"] == "T", collection
    assert 2 not in contexts(folder) and not list(job.dump_dir.glob(f"node2/{folder.name}/rank_00002.*"))
    assert f"event {folder.name} is already over: not joined" in job.log(2), job.log(2)[-4000:]
    line = next(line for line in log.splitlines() if line.startswith("STORE_KEYS_LEFT "))
    left = json.loads(line.split(" ", 1)[1])["left"]
    assert not [k for k in left if k.startswith(("ev/1/rank/", "ev/1/blob/", "ev/1/dumped", "ev/1/want", "bell/"))], line
