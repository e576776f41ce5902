"""Test-wide hygiene: every test gets back the environment it started with, and no process group
survives a test. Every test that runs a real multi-process job is marked ``jobs`` here, so
``pytest -m "not jobs"`` runs the rest."""

from __future__ import annotations

import inspect
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

JOB_LAUNCHERS = frozenset({"run_job", "start_job", "run_ranks_by_hand", "run_jobs"})
"""The helpers that start real jobs (``support``, ``watchdog/harness``, ``straggler/harness``,
``analysis/gloo_jobs``): a test that calls one, itself, through a helper of its module or through
a fixture, is a job test."""
JOB_FOLDERS = frozenset({"multihost"})
"""Folders whose every test runs one (two hosts as network namespaces)."""


def _names_in(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def _runs_a_job(function: Any, seen: set[types.CodeType]) -> bool:
    """Whether ``function``, or a function of its own module it names, names a job launcher."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names = _names_in(code)
    if names & JOB_LAUNCHERS:
        return True
    module_globals = getattr(function, "__globals__", {})
    return any(_runs_a_job(module_globals[name], seen) for name in names
               if inspect.isfunction(module_globals.get(name))
               and module_globals[name].__module__ == function.__module__)


def _is_job(item: pytest.Item) -> bool:
    path = Path(str(item.path))
    if path.stem.endswith("_jobs") or JOB_FOLDERS & set(path.parts):
        return True
    seen: set[types.CodeType] = set()
    if _runs_a_job(getattr(item, "function", None), seen):
        return True
    fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(_runs_a_job(d.func, seen) for defs in fixtures.values() for d in defs)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_job(item):
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
