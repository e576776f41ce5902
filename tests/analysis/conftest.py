"""Real gloo dumps, made once per test session by small multi-process jobs (see gloo_jobs.py)."""

from __future__ import annotations

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
    root = tmp_path_factory.mktemp("gloo")
    return run_jobs({s: root / s for s in SCENARIOS})


@pytest.fixture
def nccl_data() -> Path:
    return DATA / "nccl-h200"
