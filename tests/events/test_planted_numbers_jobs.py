"""A store client plants 200 closed events (16 KB) into a running job; then rank 1 gets stuck in
``training_step``. Before, every rank logged "no event number free within 64", marked the stall
reported and never dumped it: the hang ran on with no summary. Now the ranks look past the planted
run and the hang is dumped, summarized and ends the job as usual (75)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hostile_checks import Sandbox
from hostile_store import HostileStore
from support import clean_env, free_port, kill_session, start_job

from lightning_ncclx.events.keys import meta_key
from lightning_ncclx.events.wire import EventMeta

JOB = Path(__file__).resolve().parents[1] / "watchdog" / "jobs" / "train_job.py"
WORLD = 2
PLANTED = 200
JOB_SECONDS = 240


def _every_watchdog_started(hostile: HostileStore) -> bool:
    return sum((hostile.get(n) or b"").count(b"\n") for n in hostile.names("procs/")) >= WORLD


@pytest.mark.timeout(400)
def test_a_real_hang_after_200_planted_closed_events_is_dumped_and_summarized(tmp_path: Path) -> None:
    sandbox = Sandbox.create(tmp_path)
    port = free_port()
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **sandbox.env()})
    marker = tmp_path / "stuck"
    argv = [sys.executable, str(JOB), "--dump-dir", str(sandbox.dump_dir), "--devices", str(WORLD),
            "--strategy", "ddp_ncclx", "--fault", "stuck_train", "--fault-rank", "1", "--at-batch", "12",
            "--batches", "30", "--step-sleep", "0.2", "--no-consensus", "--marker", str(marker)]
    proc = start_job(argv, env=env, cwd=tmp_path, log=tmp_path / "job.log")
    try:
        with HostileStore("127.0.0.1", port, timeout_seconds=60) as hostile:
            assert hostile.wait_for(lambda names: _every_watchdog_started(hostile), JOB_SECONDS), \
                (tmp_path / "job.log").read_text()
            for number in range(1, PLANTED + 1):
                hostile.set(meta_key(number), EventMeta.new(number, "stall", 0, time.time()).to_json(closed=True))
            planted_before_the_fault = not marker.exists()
            code = proc.wait(timeout=JOB_SECONDS)
    finally:
        kill_session(proc)
        proc.wait()
    log = (tmp_path / "job.log").read_text(errors="replace")
    assert planted_before_the_fault, "the fault started before the planting ended: raise --at-batch"
    assert code == 75, log[-5000:]
    stalls = [p for p in sandbox.dump_dir.iterdir() if p.name.startswith("stall-")]
    assert [p.name for p in stalls] == [f"stall-{PLANTED + 1:03d}"], log[-5000:]
    summary = json.loads((stalls[0] / "summary.json").read_text())
    assert summary["culprit_ranks"] == [1], log[-5000:]
