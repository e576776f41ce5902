"""``lightning-ncclx dump RUN_DIR`` on a real running job: a Lightning fit (``ddp_ncclx`` on gloo,
2 ranks) whose dumps go to ``<run dir>/ncclx_dumps/<run id>``; the command finds that folder,
the job takes the request and every rank dumps into ``ondemand-001`` while training goes on."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from support import clean_env, contexts, kill_session, start_job

JOB = Path(__file__).parent / "watchdog" / "jobs" / "signal_reset_job.py"


def _running_dump_folder(run_dir: Path, seconds: float) -> Path | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = list(run_dir.glob("ncclx_dumps/*/.rank_00001.native-stacks.txt"))
        if found:
            return found[0].parent
        time.sleep(0.2)
    return None


def test_the_command_makes_every_rank_of_a_running_job_dump(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = start_job([sys.executable, str(JOB), "--mode", "none", "--run-dir", "--dump-dir", str(run_dir),
                     "--devices", "2", "--step-seconds", "0.1", "--max-seconds", "150"],
                    env=clean_env({"OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}), cwd=tmp_path,
                    log=tmp_path / "job.log")
    try:
        dump_dir = _running_dump_folder(run_dir, 120)
        assert dump_dir is not None, (tmp_path / "job.log").read_text()[-3000:]
        command = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "dump", str(run_dir), "--wait", "60"],
                                 capture_output=True, text=True, timeout=120, env=clean_env())
        job_code = job.wait(timeout=150)
    finally:
        kill_session(job)
        job.wait()
    log = (tmp_path / "job.log").read_text()
    assert command.returncode == 0, command.stdout + command.stderr
    assert command.stdout.strip() == f"the job took the request: every rank dumps into {dump_dir / 'ondemand-001'}"
    assert job_code == 0, log[-3000:]
    found = contexts(dump_dir / "ondemand-001")
    assert sorted(found) == [0, 1] and found[0]["reason"] == "on_demand", log[-3000:]
    assert not (dump_dir / "DUMP_NOW").exists()
