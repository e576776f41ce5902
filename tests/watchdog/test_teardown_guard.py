"""``watchdog/teardown_guard.py``: the exit guard is registered with ``atexit`` once per process
(the latest settings win); at exit it starts a daemon timer named ``ncclx-exit-guard``; when
that fires, the stacks go to ``<dump_dir>/teardown-rank<R>.stacks.txt`` and the process ends
with ``exit_code`` - or only logs when there is none. ``atexit`` registration is captured (the
test process must not arm a real guard) and ``hard_exit`` records instead of exiting."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_ncclx.watchdog import teardown_guard


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> list:
    """What the guard hands to ``atexit``, with the process's own guard state set aside."""
    monkeypatch.setattr(teardown_guard, "_armed", {})
    calls: list = []
    monkeypatch.setattr(teardown_guard, "atexit", SimpleNamespace(register=calls.append))  # this module's only
    return calls


def test_registered_once_and_the_latest_settings_win(registered: list, tmp_path: Path) -> None:
    exits: list[int] = []
    teardown_guard.guard_exit(tmp_path / "a", 1, 30.0, 75, lambda: "first", exits.append)
    teardown_guard.guard_exit(str(tmp_path / "b"), 2, 0.0, None, lambda: "second", exits.append)
    assert registered == [teardown_guard._start_timer]
    armed = dict(teardown_guard._armed)
    assert (armed["dump_dir"], armed["rank"], armed["seconds"], armed["exit_code"]) == (tmp_path / "b", 2, 0.0, None)
    assert armed["write_stacks"]() == "second"


def test_a_hang_at_exit_writes_the_stacks_and_ends_the_process_with_the_exit_code(tmp_path: Path,
                                                                                 caplog: pytest.LogCaptureFixture) -> None:
    exits: list[int] = []
    with caplog.at_level(logging.ERROR, logger=teardown_guard.__name__):
        teardown_guard._on_hang(dump_dir=tmp_path / "new" / "dumps", rank=3, seconds=120.0, exit_code=76,
                                write_stacks=lambda: "Thread MainThread\n  in destroy_process_group\n",
                                hard_exit=exits.append)
    path = tmp_path / "new" / "dumps" / "teardown-rank3.stacks.txt"
    assert path.read_text() == "Thread MainThread\n  in destroy_process_group\n"
    assert exits == [76]
    assert [r.getMessage() for r in caplog.records] == [
        f"[rank 3] still exiting 120 s after training ended (destroy_process_group?): stacks in {path}; "
        "exiting with code 76"]


def test_without_an_exit_code_a_hang_at_exit_is_only_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    exits: list[int] = []
    with caplog.at_level(logging.ERROR, logger=teardown_guard.__name__):
        teardown_guard._on_hang(dump_dir=tmp_path, rank=0, seconds=5.0, exit_code=None, write_stacks=lambda: "s",
                                hard_exit=exits.append)
    assert exits == [] and (tmp_path / "teardown-rank0.stacks.txt").read_text() == "s"
    assert caplog.records[-1].getMessage().endswith("stacks in " + str(tmp_path / "teardown-rank0.stacks.txt"))


def test_stacks_that_cannot_be_written_do_not_stop_the_exit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> str:
        raise RuntimeError("frames vanished")

    exits: list[int] = []
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the dump folder should be
    with caplog.at_level(logging.ERROR, logger=teardown_guard.__name__):
        teardown_guard._on_hang(dump_dir=tmp_path, rank=1, seconds=1.0, exit_code=75, write_stacks=broken,
                                hard_exit=exits.append)
        teardown_guard._on_hang(dump_dir=blocker, rank=1, seconds=1.0, exit_code=75, write_stacks=lambda: "s",
                                hard_exit=exits.append)
    assert exits == [75, 75]
    assert not (tmp_path / "teardown-rank1.stacks.txt").exists()
    assert sum(r.getMessage().startswith("writing ") for r in caplog.records) == 2


def test_at_exit_a_daemon_timer_fires_with_the_armed_settings(registered: list, tmp_path: Path) -> None:
    fired = threading.Event()
    exits: list[int] = []

    def hard_exit(code: int) -> None:
        exits.append(code)
        fired.set()

    teardown_guard.guard_exit(tmp_path, 4, 0.001, 75, lambda: "stacks", hard_exit)
    registered[0]()  # what atexit does
    timers = [t for t in threading.enumerate() if t.name == "ncclx-exit-guard"]
    assert len(timers) <= 1 and all(t.daemon for t in timers)
    for timer in timers:
        timer.join(5.0)
    assert fired.is_set() and exits == [75]
    assert (tmp_path / "teardown-rank4.stacks.txt").read_text() == "stacks"
    assert not [t for t in threading.enumerate() if t.name == "ncclx-exit-guard"]
