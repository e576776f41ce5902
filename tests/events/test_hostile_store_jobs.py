"""A hostile client of a running job's store (``tests/hostile_store.py``) plants event values;
the ranks must not write outside ``dump_dir``, raise, hang or end the job.

Each test runs a real 2-rank ``ddp_ncclx`` job (Lightning's launcher, gloo) whose dump folder is
a subfolder of a sandbox that also holds its HOME, and checks the sandbox afterwards.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hostile_checks import Sandbox
from hostile_store import HostileStore
from support import clean_env, free_port, kill_session, start_job

JOB = Path(__file__).resolve().parents[1] / "watchdog" / "jobs" / "train_job.py"
WORLD = 2
JOB_SECONDS = 180


class WroteOutsideDumpDir(AssertionError):
    """The one failure an xfail below expects (any other failure is a real one)."""


def _start(tmp_path: Path, sandbox: Sandbox, *args: str):
    port = free_port()
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **sandbox.env()})
    argv = [sys.executable, str(JOB), "--dump-dir", str(sandbox.dump_dir), "--devices", str(WORLD),
            "--on-stall", "dump", "--strategy", "ddp_ncclx", *args]
    return start_job(argv, env=env, cwd=tmp_path, log=tmp_path / "job.log"), port


def _every_watchdog_started(hostile: HostileStore):
    """Each rank's watchdog appends its process line to ``procs/<scope>`` once it has skipped the
    events already in the store: an event planted after that is one it will take."""
    def started(names: list[str]) -> bool:
        lines = sum((hostile.get(n) or b"").count(b"\n") for n in names if n.startswith("procs/"))
        return lines >= WORLD
    return started


@pytest.mark.timeout(300)
def test_a_planted_event_named_with_dot_dot_writes_nothing_outside_dump_dir(tmp_path: Path) -> None:
    sandbox = Sandbox.create(tmp_path)
    before = sandbox.snapshot()
    proc, port = _start(tmp_path, sandbox, "--batches", "40", "--step-sleep", "0.2")
    try:
        with HostileStore("127.0.0.1", port, timeout_seconds=60) as hostile:
            assert hostile.wait_for(_every_watchdog_started(hostile), JOB_SECONDS), (tmp_path / "job.log").read_text()
            hostile.set("ev/1/meta", json.dumps({"name": "../escaped", "reason": "on_demand", "initiator": 0}))
            for rank in range(WORLD):
                hostile.set(f"bell/{rank}", "1")  # the doorbells: every rank looks at ev/1 now
        code = proc.wait(timeout=JOB_SECONDS)
    finally:
        kill_session(proc)
        proc.wait()
    log = (tmp_path / "job.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    outside = sandbox.written_outside(before)
    if outside:
        raise WroteOutsideDumpDir(f"written outside {sandbox.dump_dir}: {outside[:20]}")
