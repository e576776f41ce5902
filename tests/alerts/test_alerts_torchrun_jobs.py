"""Under torchrun, whose agent ends every rank (SIGTERM, then SIGKILL 30 s later) once one rank
exits: the summarizing rank (rank 0) SIGKILLed as it sends its trigger still gets exactly one
trigger sent, by one other rank of its host, before the agent ends the job. The store lives in the
agent, so the job-wide claim is still there to decide who sends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alerts.servers import alert_server
from support import PYTHON, clean_env, run_job

pytestmark = pytest.mark.timeout(300)
ALERT_JOB = Path(__file__).parent / "jobs" / "alert_job.py"


def test_under_torchrun_a_summarizing_rank_killed_as_it_sends_is_replaced_before_the_agent_ends_the_job(
        tmp_path: Path) -> None:
    marker = tmp_path / "killed-sender"
    dump_dir = tmp_path / "dumps"
    with alert_server(tmp_path / "server") as server:
        config = {"enabled": True, "webhook": {"url_env": "NCCLX_TEST_WEBHOOK_URL"}, "attempt_timeout_seconds": 1.0,
                  "attempts": 2, "deadline_seconds": 20.0, "confirm_seconds": 4.0}
        env = clean_env({"OMP_NUM_THREADS": "1", "NCCLX_TEST_ALERTS": json.dumps(config),
                         "NCCLX_TEST_WEBHOOK_URL": server.url("/hook/x"), "NCCLX_TEST_KILL_SENDER": str(marker)})
        torchrun = str(Path(PYTHON).parent / "torchrun")
        result = run_job([torchrun, "--standalone", "--nproc_per_node=3", str(ALERT_JOB), "--devices", "3",
                          "--dump-dir", str(dump_dir), "--strategy", "ddp_ncclx", "--fault", "stuck_train",
                          "--fault-rank", "1", "--noticer-rank", "0", "--slow-rank-threshold", "30"],
                         cwd=tmp_path, env=env, timeout=240)
        hooks = server.posts("/hook/")
    assert marker.is_file(), result.tail(120)
    assert not result.timed_out, result.tail(120)
    assert len(hooks) == 1 and hooks[0]["body"]["action"] == "trigger", (hooks, result.tail(150))
    killed = int(marker.read_text())
    (folder,) = [p for p in dump_dir.iterdir() if p.name.startswith("stall-")]
    kept = json.loads((folder / "alert-trigger.json").read_text())
    senders = {entry["sender"]["rank"] for entry in kept["sinks"].values()}
    assert killed == 0 and len(senders) == 1 and killed not in senders, (kept, result.tail(150))
    assert result.tail(400).count("whose process is gone: sending it") == 1, result.tail(150)
