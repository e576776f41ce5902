"""``SignalWakeup.keep_armed`` in this process, with real signals: native code that resets the
on-demand signal to its default action is undone; a Python choice is not; a native handler found
at install is taken over once it is gone (c10's fatal-signal handler, switched on and off)."""

from __future__ import annotations

import ctypes
import os
import signal
import threading

import pytest
import torch

from lightning_ncclx.watchdog.process_signals import read_action
from lightning_ncclx.watchdog.triggers import SignalWakeup

USR2 = signal.SIGUSR2


def _reset_in_c() -> None:
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(USR2, 0)


@pytest.fixture
def wakeup():
    assert signal.getsignal(USR2) is signal.SIG_DFL and read_action(USR2).handler == 0
    made = SignalWakeup("SIGUSR2")
    yield made
    made.uninstall()
    made.close()
    torch._C._set_print_stack_traces_on_fatal_signal(False)
    signal.signal(USR2, signal.SIG_DFL)


def test_a_reset_in_c_is_undone_from_another_thread_and_the_signal_dumps(wakeup: SignalWakeup) -> None:
    wakeup.install()
    python_handler = read_action(USR2).handler
    _reset_in_c()
    assert read_action(USR2).handler == 0 and signal.getsignal(USR2) is not signal.SIG_DFL  # Python's table is blind
    thread = threading.Thread(target=wakeup.keep_armed)  # as the watchdog thread does at each poll
    thread.start()
    thread.join()
    assert read_action(USR2).handler == python_handler
    os.kill(os.getpid(), USR2)  # SIG_DFL would end pytest here
    assert wakeup.wait(1.0)


def test_a_python_choice_of_sig_dfl_stands(wakeup: SignalWakeup) -> None:
    wakeup.install()
    signal.signal(USR2, signal.SIG_DFL)
    wakeup.keep_armed()
    assert read_action(USR2).handler == 0 and signal.getsignal(USR2) is signal.SIG_DFL


def test_a_native_handler_is_left_while_there_and_the_signal_taken_once_it_is_gone(wakeup: SignalWakeup) -> None:
    torch._C._set_print_stack_traces_on_fatal_signal(True)
    c10_handler = read_action(USR2).handler
    wakeup.install()
    wakeup.keep_armed()
    assert read_action(USR2).handler == c10_handler and not wakeup.delivers_while_blocked
    torch._C._set_print_stack_traces_on_fatal_signal(False)  # puts back the SIG_DFL it found
    assert read_action(USR2).handler == 0
    wakeup.keep_armed()
    assert read_action(USR2).handler not in (0, c10_handler) and wakeup.delivers_while_blocked
    os.kill(os.getpid(), USR2)
    assert wakeup.wait(1.0)
    wakeup.uninstall()
    assert read_action(USR2).handler == 0 and signal.getsignal(USR2) is signal.SIG_DFL
