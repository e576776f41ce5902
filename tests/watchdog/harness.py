"""Run ``jobs/train_job.py`` as a real multi-process Lightning job and read what it dumped.

Every job runs in its own session (``start_new_session=True``) and the whole process group is
killed in a ``finally``, so a test that fails or times out leaves no rank behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from support import contexts  # noqa: F401 - shared with the other multi-process tests

JOB = Path(__file__).parent / "jobs" / "train_job.py"
REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_SECONDS = 120.0
STALL_EXIT_CODE = 75
PROGRAM_ERROR_EXIT_CODE = 76
"""``exit_codes`` default for program_divergence and argument_mismatch: restarting would hang again."""


def free_port() -> int:
    """See :func:`support.free_port`."""
    from support import free_port as below_the_ephemeral_range

    return below_the_ephemeral_range()


@dataclass
class JobResult:
    returncode: int | None
    log: str
    dump_dir: Path

    def events(self, prefix: str = "") -> list[Path]:
        """Event folders (``stall-001`` ...) under the dump folder, node-local copies included."""
        found = {p for p in self.dump_dir.rglob("*") if p.is_dir() and p.name.startswith(("stall-", "ondemand-", "exception-"))
                 and p.parent.name != "ranks" and p.name.startswith(prefix)}
        return sorted(found)


@dataclass
class RunningJob:
    """A job started with :func:`start_job`; :meth:`stop` kills every rank."""

    proc: subprocess.Popen
    dump_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # every rank: the launcher's children share the session
        except ProcessLookupError:
            pass
        self.proc.wait()


def start_job(tmp_path: Path, *args: str) -> RunningJob:
    """Start the job under Lightning's own launcher (this process runs rank 0, its children the rest)."""
    dump_dir = tmp_path / "dumps"
    env = dict(os.environ)
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LIGHTNING_NCCLX_RUN_ID"):
        env.pop(key, None)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(JOB), "--dump-dir", str(dump_dir), *args]
    log_path = tmp_path / "job.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return RunningJob(proc, dump_dir, log_path)


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll ``condition`` until it holds; False after ``seconds`` (a bound, so a failure fails
    instead of hanging)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def run_job(tmp_path: Path, *args: str, timeout: float = JOB_TIMEOUT_SECONDS) -> JobResult:
    job = start_job(tmp_path, *args)
    try:
        code: int | None = job.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        job.stop()
    return JobResult(code, job.log(), job.dump_dir)



def run_ranks_by_hand(tmp_path: Path, world: int, *args: str, timeout: float = JOB_TIMEOUT_SECONDS) -> JobResult:
    """Start every rank of the job by hand (``LOCAL_RANK`` set: Lightning launches nothing and
    has no observer that kills the job when a rank dies, as under ``srun`` without
    ``--kill-on-bad-exit``). ``returncode`` is the highest exit code; each rank's log is appended."""
    from support import clean_env, kill_session, start_job

    dump_dir = tmp_path / "dumps"
    port = str(free_port())
    procs, logs = [], []
    try:
        for rank in range(world):
            env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "LOCAL_RANK": str(rank),
                             "NODE_RANK": "0", "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"})
            logs.append(tmp_path / f"rank{rank}.log")
            procs.append(start_job([sys.executable, str(JOB), "--dump-dir", str(dump_dir), "--devices", str(world), *args],
                                   env=env, cwd=tmp_path, log=logs[-1]))
        codes: list[int | None] = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for p in procs:
            kill_session(p)
            p.wait()
    text = "\n".join(f"[rank {r} log]\n" + path.read_text(errors="replace") for r, path in enumerate(logs))
    code = None if None in codes else max(codes)
    return JobResult(code, text, dump_dir)


def assert_every_rank_dumped(folder: Path, world_size: int, log: str = "") -> dict[int, dict[str, Any]]:
    found = contexts(folder)
    assert sorted(found) == list(range(world_size)), f"dumps from {sorted(found)} in {folder}\n{log[-4000:]}"
    for rank, ctx in found.items():
        assert ctx["event"] == folder.name
        assert ctx["trace_files"], f"rank {rank} wrote no flight-recorder trace"
        for name in ctx["trace_files"] + [ctx["stacks_file"]]:
            assert list(folder.rglob(name)), f"{name} missing"
    initiators = {ctx["initiator_rank"] for ctx in found.values()}
    assert len(initiators) == 1, f"ranks disagree on the initiator: {initiators}"
    return found


def assert_culprit(folder: Path, rank: int, log: str = "") -> dict[str, Any]:
    """summary.json names ``rank`` as the culprit (a missing summary fails: the analyzer must run)."""
    path = folder / "summary.json"
    assert path.is_file(), f"no summary.json in {folder}\n{log[-4000:]}"
    summary = json.loads(path.read_text())
    culprits = summary.get("culprit_ranks")
    assert culprits is not None, f"summary.json has no culprit_ranks: {sorted(summary)}"
    assert rank in culprits, f"culprit ranks {culprits}, expected {rank}; verdict {summary.get('verdict')}"
    for name in ("summary.txt", "summary.html"):
        assert (folder / name).is_file()
    return summary
