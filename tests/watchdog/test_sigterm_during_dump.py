"""A launcher's SIGTERM that lands while the watchdog writes an exception's evidence (torchrun
and SLURM end the other ranks moments after one raised) waits until the evidence is on disk:
a handler that raises then (Lightning's broadcasts on the default group, which raises once a
peer is gone) no longer cuts the summary short. Real one-rank Lightning fit in its own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import PYTHON, clean_env, run_job

pytestmark = pytest.mark.timeout(240)
JOB = Path(__file__).parent / "jobs" / "sigterm_in_dump_job.py"


def test_a_sigterm_during_the_exception_dump_is_handled_after_the_summary(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(JOB), str(tmp_path)], cwd=tmp_path, env=clean_env({"OMP_NUM_THREADS": "1"}),
                     timeout=180)
    log = result.tail(400)
    assert not result.timed_out and "fit raised: boom in training_step" in log, log[-6000:]
    assert "SIGTERM handled" in log, log[-6000:]  # the launcher's signal still reached its handler
    summaries = list((tmp_path / "ncclx_dumps").glob("run-*/exception-*/summary.json"))
    assert len(summaries) == 1, log[-6000:]
    summary = json.loads(summaries[0].read_text())
    assert "boom in training_step" in json.dumps(summary), summary
    assert "the SIGTERM handler raised RuntimeError" in log, log[-6000:]
