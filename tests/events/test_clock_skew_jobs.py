"""Two ranks started by hand, rank 1's host clock 300 s ahead (``time.time`` of that process only,
see ``clock_ahead/sitecustomize.py``). Rank 0 starts an on-demand event; before, rank 1 judged
the fresh event "already over: not joined" by comparing its wall clock with rank 0's, and
vanished from the summary. Now it judges the event's age on its own monotonic clock, dumps, and
names the clock skew in its log."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from hostile_checks import Sandbox
from support import clean_env, free_port, kill_session, start_job

JOB = Path(__file__).resolve().parents[1] / "watchdog" / "jobs" / "train_job.py"
CLOCK_AHEAD = Path(__file__).resolve().parent / "clock_ahead"
JOB_SECONDS = 240


@pytest.mark.timeout(400)
def test_a_rank_whose_host_clock_is_300_s_ahead_joins_a_fresh_event_and_names_the_skew(tmp_path: Path) -> None:
    sandbox = Sandbox.create(tmp_path)
    port = free_port()
    procs = []
    for rank in range(2):
        env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_RANK": str(rank),
                         "NODE_RANK": "0", "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", **sandbox.env()})
        if rank == 1:
            env["PYTHONPATH"] = os.pathsep.join([str(CLOCK_AHEAD), env["PYTHONPATH"]])
            env["CLOCK_AHEAD_SECONDS"] = "300"
        argv = [sys.executable, str(JOB), "--dump-dir", str(sandbox.dump_dir), "--devices", "2",
                "--strategy", "ddp_ncclx", "--fault", "signal", "--fault-rank", "0", "--at-batch", "3",
                "--batches", "12"]
        procs.append(start_job(argv, env=env, cwd=tmp_path, log=tmp_path / f"rank{rank}.log"))
    try:
        codes = [p.wait(timeout=JOB_SECONDS) for p in procs]
    finally:
        for p in procs:
            kill_session(p)
            p.wait()
    logs = [(tmp_path / f"rank{r}.log").read_text(errors="replace") for r in range(2)]
    detail = f"{codes}\n" + "\n".join(log[-3000:] for log in logs)
    assert codes == [0, 0], detail
    events = [p for p in sandbox.dump_dir.iterdir() if p.name.startswith("ondemand-")]
    assert [p.name for p in events] == ["ondemand-001"], detail
    collection = json.loads((events[0] / "collection.json").read_text())
    assert collection["dumped_ranks"] == [0, 1], detail
    assert "clock skew" in logs[1] and "already over" not in logs[1], detail
