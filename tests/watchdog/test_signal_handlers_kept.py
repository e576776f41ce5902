"""The on-demand signal's previous handler, Python's or faulthandler's, keeps working while the
watchdog runs and after it stops, and a handler installed after the watchdog's stays.

Each case is a real process: it sets up the user's handler, starts the watchdog's signal wakeup
(or a real 1-rank gloo watchdog), sends itself ``SIGUSR2`` with kill(2) during and after, and
prints what happened. A signal sent to its own process by the main thread is delivered to that
thread before kill returns (Linux picks the calling thread when it does not block the signal), so
the lines come out in a fixed order: faulthandler writes to the same pipe as the prints.

Only ``python_before`` passes on the code before this file: the other cases lost faulthandler's
handler while the watchdog ran, left SIG_DFL behind (the second kill ended the process), or left
the signal's flags changed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from support import clean_env, run_job

TESTS = Path(__file__).resolve().parents[1]

SIGNAL_WAKEUP_SCRIPT = r"""
import ctypes, faulthandler, os, signal, struct, sys
from lightning_ncclx.watchdog.triggers import SignalWakeup

USR2 = signal.SIGUSR2
scenario = sys.argv[1]


def kernel_action():
    # handler, the kernel's 64-bit mask and the flags (64-bit glibc's layout), read here rather
    # than through the module under test; the rest of glibc's 128-byte mask is never set, and
    # glibc adds SA_RESTORER to every action it sets
    buffer = ctypes.create_string_buffer(512)
    assert ctypes.CDLL(None).sigaction(USR2, None, buffer) == 0
    handler, mask, flags = struct.unpack_from("PQi", buffer.raw, 0)[0:2] + struct.unpack_from("i", buffer.raw, 136)
    return handler, mask, flags & ~0x04000000


def python_handler(signum, frame):
    print("python handler ran", flush=True)


if scenario in ("python_before", "faulthandler_over_python"):
    signal.signal(USR2, python_handler)
if scenario in ("faulthandler", "faulthandler_over_python"):
    faulthandler.register(USR2)
before = (signal.getsignal(USR2), kernel_action())
wakeup = SignalWakeup("SIGUSR2")
wakeup.install()
if scenario == "python_after":
    signal.signal(USR2, python_handler)
if scenario == "faulthandler_after":
    faulthandler.register(USR2)
if scenario == "faulthandler_chained_after":  # the way to get faulthandler's stacks and the dump
    faulthandler.register(USR2, chain=True)
installed_after = (signal.getsignal(USR2), kernel_action())
print("during", flush=True)
os.kill(os.getpid(), USR2)
print("watchdog saw it:", wakeup.wait(0), flush=True)
wakeup.uninstall()
wakeup.close()
print("after", flush=True)
if scenario != "default":  # SIG_DFL again: the signal would end the process, as before
    os.kill(os.getpid(), USR2)
print("survived", flush=True)
now = (signal.getsignal(USR2), kernel_action())
expected = installed_after if scenario.endswith("_after") else before
print("handler as expected after stop:", now == expected, flush=True)
print("wakeup fd free:", signal.set_wakeup_fd(-1) == -1, flush=True)
"""

FAULTHANDLER_STACK = "Current thread (most recent call first):"
PYTHON_HANDLER = "python handler ran"


def _run(script: str, *args: str):
    result = run_job([sys.executable, "-c", script, *args], timeout=120.0,
                     env=clean_env({"PYTHONPATH": f"{TESTS.parent}:{TESTS}"}))
    assert not result.timed_out, result.tail()
    return result


def _lines(output: str) -> list[str]:
    """The prints and the first line of each faulthandler dump, in order."""
    return [re.sub(r" 0x[0-9a-f]+", "", line) for line in output.splitlines()
            if not line.startswith("  File ") and line.strip() and "left in place" not in line]


def test_with_no_handler_before_the_signal_is_seen_and_sig_dfl_is_back_exactly_after() -> None:
    result = _run(SIGNAL_WAKEUP_SCRIPT, "default")
    assert result.returncode == 0, result.tail()
    assert _lines(result.output) == [
        "during", "watchdog saw it: True", "after", "survived",
        "handler as expected after stop: True", "wakeup fd free: True",
    ], result.tail()


@pytest.mark.parametrize(("scenario", "handler_line", "watchdog_sees_it"), [
    ("faulthandler", FAULTHANDLER_STACK, False),
    ("faulthandler_over_python", FAULTHANDLER_STACK, False),
    ("faulthandler_after", FAULTHANDLER_STACK, False),
    ("faulthandler_chained_after", FAULTHANDLER_STACK, True),
    ("python_before", PYTHON_HANDLER, True),
    ("python_after", PYTHON_HANDLER, True),
])
def test_the_users_handler_works_while_the_wakeup_is_installed_and_after(
        scenario: str, handler_line: str, watchdog_sees_it: bool) -> None:
    result = _run(SIGNAL_WAKEUP_SCRIPT, scenario)
    assert result.returncode == 0, result.tail()
    assert _lines(result.output) == [
        "during", handler_line, f"watchdog saw it: {watchdog_sees_it}",
        "after", handler_line, "survived",
        "handler as expected after stop: True", "wakeup fd free: True",
    ], result.tail()


GLOO_WATCHDOG_SCRIPT = r"""
import faulthandler, os, signal, sys
from pathlib import Path
from support import one_rank_gloo
from lightning_ncclx.config import WatchdogConfig
from lightning_ncclx.watchdog.runtime import WatchdogRuntime

faulthandler.register(signal.SIGUSR2, all_threads=True)
work = Path(sys.argv[1])
with one_rank_gloo(work / "store"):
    runtime = WatchdogRuntime(WatchdogConfig(), work / "dumps")
    runtime.start()
    print("during", flush=True)
    os.kill(os.getpid(), signal.SIGUSR2)
    print("signal sent during", flush=True)
    runtime.stop()
print("after", flush=True)
os.kill(os.getpid(), signal.SIGUSR2)
print("survived", flush=True)
"""


def test_faulthandlers_stacks_come_during_and_after_a_real_gloo_watchdog(tmp_path: Path) -> None:
    """The usual recipe for stacks of a hung job, ``faulthandler.register(SIGUSR2)``, next to a
    real watchdog (1-rank gloo job): ``kill -USR2`` prints the stacks and the job lives on."""
    result = _run(GLOO_WATCHDOG_SCRIPT, str(tmp_path))
    assert result.returncode == 0, result.tail()
    markers = [line for line in result.output.splitlines()
               if line in ("during", "signal sent during", "after", "survived")
               or line.startswith("Current thread ")]
    assert [m.split(" 0x")[0] for m in markers] == [
        "during", "Current thread", "signal sent during", "after", "Current thread", "survived",
    ], result.tail()
    assert "does not start a dump in this process" in result.output  # the log says why no dump came
    assert not (tmp_path / "dumps").exists() or not any((tmp_path / "dumps").glob("ondemand-*"))
