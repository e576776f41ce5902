"""Real gloo dumps, made once per test run by small multi-process jobs (see gloo_jobs.py): under
pytest-xdist the first worker to ask makes them in a folder every worker of the run shares,
under a file lock, and the others read that folder."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gloo_jobs import SCENARIOS, run_jobs  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def gloo_dumps(tmp_path_factory) -> dict[str, Path]:
    """scenario -> folder with ``ours/`` (the plugin's layout), ``torch/`` and ``fixed/``
    subfolders (3 ranks; rank 2 misbehaves)."""
    base = tmp_path_factory.getbasetemp()
    # each xdist worker's basetemp sits in the run's own folder (pytest-N/popen-gwK)
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gloo-shared"
    root.mkdir(parents=True, exist_ok=True)
    made = root / "made.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the jobs raise
        if not made.is_file():
            run_jobs({s: root / s for s in SCENARIOS})
            made.write_text(json.dumps(list(SCENARIOS)))
    return {s: root / s for s in SCENARIOS}


@pytest.fixture
def nccl_data() -> Path:
    return DATA / "nccl-h200"
