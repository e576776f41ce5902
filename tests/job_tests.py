"""Which tests run a real multi-process job: the rule behind the ``jobs`` marker that
``tests/conftest.py`` sets at collection (``pytest -m "not jobs"`` runs the rest)."""

from __future__ import annotations

import inspect
import types
from pathlib import Path
from typing import Any

import pytest

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


def runs_a_job(function: Any, seen: set[types.CodeType]) -> bool:
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
    return any(runs_a_job(module_globals[name], seen) for name in names
               if inspect.isfunction(module_globals.get(name))
               and module_globals[name].__module__ == function.__module__)


def is_job(item: pytest.Item) -> bool:
    path = Path(str(item.path))
    if path.stem.endswith("_jobs") or JOB_FOLDERS & set(path.parts):
        return True
    seen: set[types.CodeType] = set()
    if runs_a_job(getattr(item, "function", None), seen):
        return True
    fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(runs_a_job(d.func, seen) for defs in fixtures.values() for d in defs)
