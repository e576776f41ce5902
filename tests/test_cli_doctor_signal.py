"""``lightning-ncclx doctor`` says what the on-demand signal would do in a process of this set-up,
after ``import torch`` (and CUDA's set-up where a device is there): the default action, or a
handler set outside Python that holds it, named by its library, with the trigger that works
instead. The held case is c10's real fatal-signal handler, switched on in the doctor's process."""

from __future__ import annotations

import json
import subprocess
import sys

from support import clean_env

DOCTOR_WITH_C10_HANDLER = r"""
import contextlib, io, json, torch
torch._C._set_print_stack_traces_on_fatal_signal(True)
from lightning_ncclx.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["doctor", "--json"])
print(json.dumps({"code": code, "report": json.loads(out.getvalue())}))
"""


def test_the_default_action_is_reported_as_the_watchdogs_to_take() -> None:
    done = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "doctor", "--json"], capture_output=True,
                          text=True, timeout=120, env=clean_env())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["on_demand_signal"].startswith("SIGUSR2: default action (ends the process)")
    assert not any("outside Python" in note for note in report["notes"])


def test_a_native_handler_is_named_with_the_trigger_that_works_instead() -> None:
    done = subprocess.run([sys.executable, "-c", DOCTOR_WITH_C10_HANDLER], capture_output=True, text=True,
                          timeout=120, env=clean_env())
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    line = result["report"]["on_demand_signal"]
    assert result["code"] == 0  # a note, not a broken set-up
    assert line.startswith("SIGUSR2: a handler set outside Python holds it here (in libc10.so)"), line
    assert "`lightning-ncclx dump <dump folder>`" in line and line in result["report"]["notes"]
