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


DURATIONS = Path(__file__).with_name("durations.txt")
UNKNOWN_JOB_SECONDS = 20.0
"""What a job test not yet in ``durations.txt`` is taken to last."""


def _known_durations() -> dict[str, float]:
    known: dict[str, float] = {}
    for line in DURATIONS.read_text().splitlines() if DURATIONS.is_file() else ():
        seconds, _, nodeid = line.partition(" ")
        if line and not line.startswith("#"):
            known[nodeid] = float(seconds)
    return known


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the job tests, and start the longest work first (by ``durations.txt``): on 2 cores
    the suite is CPU-bound, and a long test started last would run alone at the end. A module
    whose fixture is costly and shared by its tests is one ``xdist_group`` (``make test``
    runs ``--dist loadgroup``), placed by the time of all its tests. Every worker sorts the
    same way, so they agree on the order."""
    known = _known_durations()
    expected: dict[str, float] = {}
    groups: dict[str, float] = {}
    for item in items:
        job = is_job(item)
        if job:
            item.add_marker(pytest.mark.jobs)
        plain = item.nodeid.rsplit("@", 1)[0] if item.get_closest_marker("xdist_group") else item.nodeid
        expected[item.nodeid] = known.get(plain, UNKNOWN_JOB_SECONDS if job else 0.0)
        group = _group_of(item)
        if group is not None:
            groups[group] = groups.get(group, 0.0) + expected[item.nodeid]

    def weight(item: pytest.Item) -> float:
        group = _group_of(item)
        return groups[group] if group is not None else expected[item.nodeid]

    items.sort(key=lambda item: -weight(item))


def _group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return None
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


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
