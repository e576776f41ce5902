"""The ``jobs`` marker (``tests/job_tests.py``, set by ``tests/conftest.py``): a test that starts a real job, itself, through a
helper of its module or through a fixture, is marked; so is every test of a ``*_jobs.py`` file;
a unit test is not. ``pytest -m "not jobs"`` (the contributors' fast suite) relies on it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from job_tests import runs_a_job
from support import REPO_ROOT, clean_env


def run_job(*_: Any) -> None:  # stands for support.run_job: only its name matters to the scan
    pass


def _helper_that_starts_a_job() -> None:
    run_job("train.py")


def _test_calling_a_launcher() -> None:
    run_job("train.py")


def _test_calling_a_helper_of_its_module() -> None:
    _helper_that_starts_a_job()


def _test_with_a_nested_function() -> None:
    def later() -> None:
        _helper_that_starts_a_job()

    later()


def _unit_test() -> None:
    assert sorted([2, 1]) == [1, 2]


# Reached through a dict, which the scan does not follow: this file's own tests stay unmarked.
SAMPLES = {"jobs": (_test_calling_a_launcher, _test_calling_a_helper_of_its_module, _test_with_a_nested_function),
           "unit": (_unit_test,)}


def test_a_launcher_called_directly_through_a_helper_or_a_nested_function_makes_a_job() -> None:
    for function in SAMPLES["jobs"]:
        assert runs_a_job(function, set()), function.__name__
    assert not any(runs_a_job(function, set()) for function in SAMPLES["unit"])


def test_collection_marks_job_tests_and_only_them() -> None:
    files = ["tests/strategies/test_launchers.py", "tests/watchdog/test_stall_jobs.py",
             "tests/analysis/test_gloo_scenarios.py", "tests/backend/test_serving.py", "tests/multihost/test_slurm_env.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "jobs",
                           *files], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    marked = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert marked == set(files) - {"tests/backend/test_serving.py"}, done.stdout + done.stderr
    assert "tests/strategies/test_launchers.py::test_torchrun_three_ranks" in done.stdout  # run_job, directly
    assert "test_gloo_scenarios.py::" in done.stdout  # the gloo_dumps fixture starts the gloo jobs
