"""Test-wide hygiene: every test gets back the environment it started with, and no process group
survives a test. Every test that runs a real multi-process job is marked ``jobs`` here (the rule:
``job_tests.py``), so ``pytest -m "not jobs"`` runs the rest."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from job_tests import is_job  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_job(item):
            item.add_marker(pytest.mark.jobs)


@pytest.fixture(autouse=True)
def _restore_environment_and_process_group():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
