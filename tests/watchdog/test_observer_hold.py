"""``watchdog/observer_hold.py``: Lightning's real child-process observer, with a real failed child
and a stand-in for the launching process (a sleeping process, so the test's own survives the
kill). Its kill waits while this process summarizes an event, at most ``HOLD_SECONDS``."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

from lightning_ncclx.watchdog import observer_hold
from lightning_ncclx.watchdog.observer_hold import install, summarizing


@pytest.fixture
def failed_child_and_launcher():
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    failed.wait()
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield failed, launcher
    launcher.kill()
    launcher.wait()


def test_the_observers_kill_waits_for_the_summary(failed_child_and_launcher) -> None:
    failed, launcher = failed_child_and_launcher
    install()
    install()  # twice: still one hold
    observer = _ChildProcessObserver(launcher.pid, [failed], sleep_period=0)
    started, release = threading.Event(), threading.Event()
    alive_when_written: list[bool] = []

    def summary() -> None:
        with summarizing():
            started.set()
            release.wait(10)
            alive_when_written.append(launcher.poll() is None)

    writer = threading.Thread(target=summary)
    writer.start()
    started.wait(10)
    killer = threading.Thread(target=observer._run)  # finds the failed child and kills
    killer.start()
    killer.join(0.5)
    assert killer.is_alive()  # held
    release.set()
    writer.join(10)
    killer.join(10)
    assert alive_when_written == [True]
    assert launcher.wait(10) == -9  # then killed as Lightning does


def test_without_a_summary_the_kill_is_not_held_and_a_hold_is_bounded(failed_child_and_launcher,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    failed, launcher = failed_child_and_launcher
    install()
    monkeypatch.setattr(observer_hold, "HOLD_SECONDS", 0.3)
    with summarizing():  # a summary that never ends: the kill still comes
        _ChildProcessObserver(launcher.pid, [failed], sleep_period=0)._run()
        assert launcher.wait(10) == -9
