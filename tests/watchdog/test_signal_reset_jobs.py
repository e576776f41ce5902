"""``kill -USR2`` never ends a job, whatever native code does with the signal after set-up.

On an H200 (torch 2.11, NCCL) the signal's action was a native handler at set-up and back at
SIG_DFL when the signal came, so the signal's default action ended the rank (exit -12). Each
case here is a real Lightning fit (``ddp_ncclx`` on gloo) in which native code changes the
kernel's action after set-up: libc's ``signal(SIGUSR2, SIG_DFL)`` through ctypes, between steps or
inside a step that then receives the signal, and c10's own fatal-signal handler switched on
before the fit and off during it (which puts back the SIG_DFL it found). The rank survives the
signal and every rank dumps (``ondemand-001``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from support import clean_env, contexts, run_job

JOB = Path(__file__).parent / "jobs" / "signal_reset_job.py"


def _fit(tmp_path: Path, mode: str):
    return run_job([sys.executable, str(JOB), "--mode", mode, "--dump-dir", str(tmp_path / "dumps")],
                   env=clean_env({"OMP_NUM_THREADS": "1"}), cwd=tmp_path, timeout=180.0)


@pytest.mark.parametrize(("mode", "logged"), [
    ("libc_reset", "SIGUSR2 was reset to its default action (which ends the process) outside Python"),
    ("libc_reset_in_a_stuck_step", "SIGUSR2 was reset to its default action (which ends the process) outside Python"),
    ("c10_handler_removed", "the handler set outside Python for SIGUSR2 was removed, leaving the default action"),
])
def test_the_signal_dumps_and_the_fit_goes_on_after_native_code_reset_it(tmp_path: Path, mode: str, logged: str) -> None:
    result = _fit(tmp_path, mode)
    assert not result.timed_out, result.tail()
    assert result.returncode == 0, result.tail()  # -12: the signal's default action ended the rank
    assert "signal sent" in result.output and "fit ended" in result.output, result.tail()
    assert result.output.count(logged) == 1, result.tail()
    found = contexts(tmp_path / "dumps" / "ondemand-001")
    assert sorted(found) == [0] and found[0]["reason"] == "on_demand", result.tail()
    if mode == "c10_handler_removed":  # at set-up the rank said which trigger works meanwhile
        assert "does not start a dump in this process; `lightning-ncclx dump <dump folder>`" in result.output
