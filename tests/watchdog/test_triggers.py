"""``watchdog/triggers.py``, on its own: the signal wakeup (a real signal sent to this process,
the real wakeup fd), which rank looks for ``DUMP_NOW`` and how often, and who takes the file.

The whole on-demand dump (watchdog thread, chained handler, blocked main thread) is in
``tests/watchdog/test_runtime.py``."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from lightning_ncclx.watchdog.triggers import FileTrigger, SignalWakeup, checks_file_trigger


@pytest.fixture
def user_handler():
    """A handler of the user's own for SIGUSR2, put back (with no wakeup fd) after the test."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    assert signal.set_wakeup_fd(-1) == -1, "a wakeup fd is already set in this process"
    yield calls
    signal.signal(signal.SIGUSR2, previous)
    signal.set_wakeup_fd(-1)


def test_the_signal_is_delivered_through_the_wakeup_fd_and_the_users_handler_still_runs(user_handler) -> None:
    wakeup = SignalWakeup("SIGUSR2")
    wakeup.install()
    try:
        assert wakeup.delivers_while_blocked is True
        os.kill(os.getpid(), signal.SIGUSR2)
        assert wakeup.wait(0.5) is True
        assert wakeup.wait(0) is False  # one signal, seen once
        assert user_handler == [signal.SIGUSR2]
    finally:
        wakeup.uninstall()
        wakeup.close()


def test_a_wake_for_stop_is_not_taken_for_the_signal(user_handler) -> None:
    wakeup = SignalWakeup("SIGUSR2")
    wakeup.install()
    try:
        wakeup.wake()
        assert wakeup.wait(0.5) is False
    finally:
        wakeup.uninstall()
        wakeup.close()


def test_uninstall_puts_back_the_users_handler_and_frees_the_wakeup_fd(user_handler) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    wakeup = SignalWakeup("SIGUSR2")
    wakeup.install()
    assert signal.getsignal(signal.SIGUSR2) != before
    wakeup.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is before
    assert signal.set_wakeup_fd(-1) == -1 and wakeup.delivers_while_blocked is False
    wakeup.close()
    assert (wakeup._read_fd, wakeup._write_fd) == (None, None)
    os.kill(os.getpid(), signal.SIGUSR2)  # the user's handler alone again
    assert user_handler == [signal.SIGUSR2]


def test_a_wakeup_fd_someone_else_owns_is_left_to_them_and_the_handler_flags_the_signal(user_handler) -> None:
    theirs_read, theirs_write = os.pipe()
    os.set_blocking(theirs_write, False)
    signal.set_wakeup_fd(theirs_write)
    wakeup = SignalWakeup("SIGUSR2")
    try:
        wakeup.install()
        assert wakeup.delivers_while_blocked is False
        assert signal.set_wakeup_fd(theirs_write) == theirs_write  # still theirs
        os.kill(os.getpid(), signal.SIGUSR2)  # handled on this (main) thread by the next bytecode
        assert wakeup.wait(0.5) is True and wakeup.wait(0) is False
        assert user_handler == [signal.SIGUSR2]
        wakeup.uninstall()
        assert signal.set_wakeup_fd(-1) == theirs_write  # uninstall did not take theirs away
    finally:
        wakeup.uninstall()
        wakeup.close()
        os.close(theirs_read)
        os.close(theirs_write)


def test_off_the_main_thread_install_sets_no_handler_but_wait_and_wake_work(user_handler) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    wakeup = SignalWakeup("SIGUSR2")
    worker = threading.Thread(target=wakeup.install)
    worker.start()
    worker.join()
    try:
        assert signal.getsignal(signal.SIGUSR2) is before and wakeup.delivers_while_blocked is False
        wakeup.wake()
        assert wakeup.wait(0.5) is False  # woken, but no signal
    finally:
        wakeup.uninstall()
        wakeup.close()


def test_without_a_signal_name_nothing_is_installed(user_handler) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    wakeup = SignalWakeup(None)
    wakeup.install()
    try:
        assert signal.getsignal(signal.SIGUSR2) is before and wakeup.delivers_while_blocked is False
        assert wakeup.wait(0) is False
    finally:
        wakeup.uninstall()
        wakeup.close()


def test_a_closed_wakeup_waits_on_its_flag() -> None:
    wakeup = SignalWakeup(None)
    assert wakeup.wait(0) is False
    wakeup._flag.set()  # what the handler does when the wakeup fd is not the watchdog's
    assert wakeup.wait(0) is True and wakeup.wait(0) is False


def test_the_trigger_file_is_taken_once_and_removed(tmp_path: Path) -> None:
    trigger = FileTrigger(tmp_path, "DUMP_NOW", checker=True, every_seconds=2.0)
    (tmp_path / "DUMP_NOW").touch()
    assert trigger.taken(now=100.0) is True
    assert list(tmp_path.iterdir()) == []  # neither the file nor the renamed copy is left
    assert trigger.taken(now=103.0) is False  # nothing there now


def test_the_folder_is_looked_at_at_most_once_per_interval(tmp_path: Path) -> None:
    trigger = FileTrigger(tmp_path, "DUMP_NOW", checker=True, every_seconds=2.0)
    assert trigger.taken(now=10.0) is False  # a look: no file
    (tmp_path / "DUMP_NOW").touch()
    assert trigger.taken(now=11.9) is False  # too soon after the last look
    assert (tmp_path / "DUMP_NOW").exists()
    assert trigger.taken(now=12.0) is True


def test_a_second_rank_finds_the_file_already_taken(tmp_path: Path) -> None:
    first = FileTrigger(tmp_path, "DUMP_NOW", checker=True)
    second = FileTrigger(tmp_path, "DUMP_NOW", checker=True)
    (tmp_path / "DUMP_NOW").touch()
    assert [first.taken(now=5.0), second.taken(now=5.0)] == [True, False]


@pytest.mark.parametrize(("name", "checker"), [(None, True), ("", True), ("DUMP_NOW", False)])
def test_no_name_or_not_the_checking_rank_never_takes_it(tmp_path: Path, name, checker: bool) -> None:
    (tmp_path / "DUMP_NOW").touch()
    assert FileTrigger(tmp_path, name, checker=checker).taken(now=100.0) is False
    assert (tmp_path / "DUMP_NOW").exists()


@pytest.mark.parametrize(("environ", "checks"), [
    ({}, True),
    ({"LOCAL_RANK": "0"}, True),
    ({"LOCAL_RANK": "3"}, False),
    ({"SLURM_LOCALID": "0"}, True),
    ({"SLURM_LOCALID": "1"}, False),
    ({"LOCAL_RANK": "0", "SLURM_LOCALID": "5"}, True),  # the launcher's LOCAL_RANK first
])
def test_one_rank_per_host_checks_for_the_file(monkeypatch: pytest.MonkeyPatch, environ: dict, checks: bool) -> None:
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert checks_file_trigger() is checks
