"""``watchdog/process_signals.py``: the kernel's action for a signal where Python's table does not
show it, and the wakeup fd taken and given back without taking another's or losing a byte. Real
signals to this process, real faulthandler, the real wakeup fd (pytest's main thread)."""

from __future__ import annotations

import faulthandler
import os
import signal
from typing import Iterator

import pytest

from lightning_ncclx.watchdog import process_signals
from lightning_ncclx.watchdog.process_signals import (
    give_back_wakeup_fd, read_action, take_wakeup_fd, write_action,
)

USR2 = signal.SIGUSR2


@pytest.fixture
def clean_slot() -> Iterator[None]:
    """No wakeup fd and SIGUSR2's handler as it was, before and after the test."""
    assert signal.set_wakeup_fd(-1) == -1, "a wakeup fd is already set in this process"
    previous = signal.getsignal(USR2)
    yield
    signal.set_wakeup_fd(-1)
    faulthandler.unregister(USR2)
    signal.signal(USR2, previous)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def _pending(read_fd: int) -> bytes:
    try:
        return os.read(read_fd, 4096)
    except BlockingIOError:
        return b""


def test_the_kernel_shows_faulthandlers_handler_where_python_says_sig_dfl(clean_slot) -> None:
    signal.signal(USR2, signal.SIG_DFL)
    assert read_action(USR2).handler == 0
    faulthandler.register(USR2)
    assert signal.getsignal(USR2) is signal.SIG_DFL  # Python's table does not know
    assert read_action(USR2).handler not in (0, 1)


def test_an_action_read_is_put_back_exactly(clean_slot) -> None:
    faulthandler.register(USR2)
    faulthandlers = read_action(USR2)
    signal.signal(USR2, lambda signum, frame: None)
    assert read_action(USR2).handler != faulthandlers.handler
    assert write_action(USR2, faulthandlers) is True
    assert read_action(USR2).handler == faulthandlers.handler
    assert read_action(USR2).raw[:16] == faulthandlers.raw[:16]  # handler and the kernel's mask


def test_a_free_wakeup_fd_is_taken_and_given_back(clean_slot, pipe) -> None:
    _, ours = pipe
    assert take_wakeup_fd(ours) is True
    assert give_back_wakeup_fd(ours) is True
    assert signal.set_wakeup_fd(-1) == -1


def test_a_wakeup_fd_set_before_stays_set(clean_slot, pipe) -> None:
    theirs_read, theirs = pipe
    signal.set_wakeup_fd(theirs)
    ours_read, ours = os.pipe()
    try:
        assert take_wakeup_fd(ours) is False
        assert signal.set_wakeup_fd(theirs) == theirs
    finally:
        os.close(ours_read)
        os.close(ours)


def test_a_wakeup_fd_set_after_ours_is_not_taken_away(clean_slot, pipe) -> None:
    _, theirs = pipe
    ours_read, ours = os.pipe()
    os.set_blocking(ours, False)
    try:
        assert take_wakeup_fd(ours) is True
        signal.set_wakeup_fd(theirs)  # e.g. an asyncio loop started after the watchdog
        assert give_back_wakeup_fd(ours) is False
        assert signal.set_wakeup_fd(-1) == theirs
    finally:
        os.close(ours_read)
        os.close(ours)


def test_a_signal_that_comes_while_looking_reaches_the_owner_of_the_wakeup_fd(clean_slot, pipe) -> None:
    """While a spare pipe stands in the slot, Python writes a signal's byte there: it is passed on."""
    theirs_read, theirs = pipe
    signal.signal(USR2, lambda signum, frame: None)  # Python's C handler: it writes the wakeup fd
    signal.set_wakeup_fd(theirs)
    with process_signals._spare_in_the_slot() as (current, pass_on_to):
        assert current == theirs
        os.kill(os.getpid(), USR2)
        signal.set_wakeup_fd(current)
        pass_on_to(current)
    assert _pending(theirs_read) == bytes([USR2])


def test_the_slot_is_emptied_when_the_final_fd_cannot_be_set(clean_slot, pipe) -> None:
    """A spare about to be closed is never left as the wakeup fd (Python would write into
    whatever file later gets its number)."""
    with pytest.raises(ValueError, match="non-blocking"):
        with process_signals._spare_in_the_slot():
            blocking_read, blocking_write = os.pipe()
            try:
                signal.set_wakeup_fd(blocking_write)
            finally:
                os.close(blocking_read)
                os.close(blocking_write)
    assert signal.set_wakeup_fd(-1) == -1
