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

# torch's TCPStore looks up the name of each peer address (::ffff:127.0.0.1 here); where no DNS
# server answers, glibc's resolver waits 5 s per lookup, and a store connection with it, every few
# dozen connections. One second keeps the tests' stores (and their jobs, which inherit this) from
# such 5 s stalls.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_job(item):
            item.add_marker(pytest.mark.jobs)


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
