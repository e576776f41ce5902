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


def _time_limit(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    try:
        return float(marker.args[0]) if marker is not None and marker.args else 0.0
    except (TypeError, ValueError):
        return 0.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_job(item):
            item.add_marker(pytest.mark.jobs)
    # The real jobs first, those allowed the longest first: pytest-xdist hands out tests in this
    # order, so the last minutes of a run are short tests that even out the workers, not one long
    # job that leaves the other worker idle. A stable sort: every worker collects the same order.
    items.sort(key=lambda item: (not is_job(item), -_time_limit(item)))


def _destroy_default_group() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _restore_environment_and_process_group():
    # Before too: a test that fails to clean up must not hand its group to the next test of the
    # same pytest worker.
    _destroy_default_group()
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    _destroy_default_group()
