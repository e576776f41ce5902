"""Python stacks written without the GIL, for a rank whose watchdog thread cannot run.

A main thread that holds the GIL in native code (a C extension, a regex, a stuck callback into
Python) starves every Python thread, the watchdog's too: that rank never dumps. The watchdog
thread re-arms ``faulthandler.dump_traceback_later`` at every poll with the current phase's
threshold; when it has not been able to run that long, faulthandler's own C thread writes every
thread's Python stack to ``<dump_dir>/.rank_<R>.native-stacks.txt``. The summarizing rank of the
same host reads it for a rank that did not dump. The file is removed at stop when empty.

The same file takes faulthandler's record of a fatal signal (SIGABRT, SIGSEGV, SIGBUS, SIGILL,
SIGFPE: ``Fatal Python error: Aborted`` and every thread's stack), where no faulthandler was
enabled before: a rank that gloo aborts inside a mismatched collective, or that crashes in native
code, leaves no dump, and that record says how it ended (:func:`fatal_signal`).

faulthandler keeps one timer per process: a job that arms its own ``dump_traceback_later`` loses
it while the watchdog runs (``native_stacks: false`` in the config leaves it alone).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import threading
from pathlib import Path
from typing import IO

from lightning_ncclx.layout import native_stacks_path

log = logging.getLogger(__name__)

MAX_READ_BYTES = 1 << 20
_FILE_LINE = re.compile(r'^\s{0,8}File "([^"\n]{1,4096})", line (\d{1,9}) in (\S{1,512})\s*$')


class NativeStackTimer:
    """Arms faulthandler's timer from the watchdog thread; fires only if that thread starves."""

    def __init__(self, dump_dir: Path, rank: int) -> None:
        self.path = native_stacks_path(dump_dir, rank)
        self._file: IO[str] | None = None
        self._header_bytes = 0
        self._made_folder = False
        self._fatal = False

    def start(self) -> None:
        self._made_folder = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = f"# main thread 0x{threading.main_thread().ident or 0:016x}, pid {os.getpid()}\n"
        self._file = open(self.path, "w", encoding="utf-8")
        self._file.write(header)
        self._file.flush()
        self._header_bytes = len(header.encode())
        if not faulthandler.is_enabled():  # one enabled before (PYTHONFAULTHANDLER, pytest) keeps its file
            faulthandler.enable(file=self._file, all_threads=True)
            self._fatal = True

    def arm(self, seconds: float) -> None:
        if self._file is not None:
            faulthandler.dump_traceback_later(max(1.0, seconds), repeat=False, file=self._file, exit=False)

    def disarm(self) -> None:
        """Before work that keeps the watchdog thread busy (an event), so it is not taken for
        starvation."""
        if self._file is not None:
            faulthandler.cancel_dump_traceback_later()

    def stop(self) -> None:
        if self._file is None:
            return
        faulthandler.cancel_dump_traceback_later()
        if self._fatal:
            faulthandler.disable()
            self._fatal = False
        handle, self._file = self._file, None
        try:
            handle.close()
            if self.path.stat().st_size <= self._header_bytes:  # it never fired
                self.path.unlink()
                if self._made_folder and not any(self.path.parent.iterdir()):
                    self.path.parent.rmdir()
        except OSError:
            log.warning("cleaning up %s failed", self.path, exc_info=True)


def main_thread_frames(path: Path) -> list[str]:
    """``file:line in function`` of the main thread's frames in a native stack dump, innermost
    first; [] when the file holds none (never raises; reads at most 1 MiB of a regular file)."""
    try:
        if not path.is_file() or path.is_symlink():
            return []
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_READ_BYTES)
    except OSError:
        return []
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# main thread 0x"):
        return []
    main = lines[0].split()[3].rstrip(",").lower()
    frames: list[str] = []
    in_main = False
    for line in lines[1:]:
        if line.startswith(("Thread 0x", "Current thread 0x")):
            if frames:
                break  # the first dump's main thread is enough
            in_main = line.split()[1 if line.startswith("Thread") else 2].lower() == main
            continue
        if in_main:
            match = _FILE_LINE.match(line)
            if match:
                frames.append(f"{match[1]}:{match[2]} in {match[3]}")
    return frames


_FATAL = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
          "Illegal instruction": "SIGILL", "Floating-point exception": "SIGFPE",
          "Floating point exception": "SIGFPE"}


def fatal_signal(path: Path) -> str | None:
    """The fatal signal faulthandler recorded in a rank's native stack file (``SIGABRT`` for
    ``Fatal Python error: Aborted``); None when there is none (never raises)."""
    try:
        if not path.is_file() or path.is_symlink():
            return None
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_READ_BYTES)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Fatal Python error: "):
            return _FATAL.get(line.removeprefix("Fatal Python error: ").strip())
    return None


def is_library_frame(frame: str) -> bool:
    return "/site-packages/" in frame or "/lib/python3" in frame or frame.startswith("<frozen")


def main_thread_top(path: Path) -> str | None:
    """The main thread's innermost frame of the user's own code (else its innermost frame)."""
    frames = main_thread_frames(path)
    if not frames:
        return None
    return next((f for f in frames if not is_library_frame(f)), frames[0])
