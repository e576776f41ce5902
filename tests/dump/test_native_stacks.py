"""faulthandler's stack dump of a rank whose watchdog thread starved: written by the real
faulthandler from a thread, read back for the summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lightning_ncclx.dump.native_stacks import main_thread_frames, main_thread_top, native_stacks_path

HOLD_GIL = """
import re, sys, time
from pathlib import Path
from lightning_ncclx.dump.native_stacks import NativeStackTimer

timer = NativeStackTimer(Path(sys.argv[1]), 7)
timer.start()
timer.arm(1.0)

def user_step():
    re.match(r"(a+)+$", "a" * 27 + "b")  # about ten seconds holding the GIL

user_step()
timer.stop()
"""


def test_a_starved_watchdog_leaves_the_main_threads_stack(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", HOLD_GIL, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    path = native_stacks_path(tmp_path, 7)
    frames = main_thread_frames(path)
    assert frames and frames[0].split(":")[0].endswith("re/__init__.py"), frames
    assert main_thread_top(path).endswith("in user_step"), frames


def test_an_unfired_timer_leaves_nothing_behind(tmp_path: Path) -> None:
    from lightning_ncclx.dump.native_stacks import NativeStackTimer

    timer = NativeStackTimer(tmp_path / "dumps", 0)
    timer.start()
    timer.arm(60.0)
    timer.stop()
    assert not (tmp_path / "dumps").exists()


def test_hostile_or_missing_files_read_as_no_frames(tmp_path: Path) -> None:
    assert main_thread_frames(tmp_path / "missing") == []
    junk = tmp_path / "junk"
    junk.write_text("# main thread 0xzz\n" + "  File \"" + " " * 100000 + "\n")
    assert main_thread_frames(junk) == []
    assert main_thread_top(tmp_path) is None  # a folder


def test_a_rank_aborted_in_native_code_leaves_a_record_of_the_signal(tmp_path) -> None:
    import subprocess
    import sys

    from lightning_ncclx.dump.native_stacks import fatal_signal, main_thread_frames
    from lightning_ncclx.layout import native_stacks_path

    code = ("import os, sys; from pathlib import Path\n"
            "from lightning_ncclx.dump.native_stacks import NativeStackTimer\n"
            "timer = NativeStackTimer(Path(sys.argv[1]), 2); timer.start()\n"
            "def training_step():\n    os.abort()\n"
            "training_step()\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -6, done.stderr
    path = native_stacks_path(tmp_path, 2)
    assert fatal_signal(path) == "SIGABRT", path.read_text()
    assert any(f.endswith(" in training_step") for f in main_thread_frames(path)), path.read_text()


def test_a_faulthandler_enabled_before_keeps_its_file(tmp_path) -> None:
    import subprocess
    import sys

    code = ("import faulthandler, os, sys; from pathlib import Path\n"
            "faulthandler.enable(sys.stderr)\n"
            "from lightning_ncclx.dump.native_stacks import NativeStackTimer\n"
            "NativeStackTimer(Path(sys.argv[1]), 0).start(); os.abort()\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert "Fatal Python error: Aborted" in done.stderr
    from lightning_ncclx.dump.native_stacks import fatal_signal
    from lightning_ncclx.layout import native_stacks_path

    assert fatal_signal(native_stacks_path(tmp_path, 0)) is None
