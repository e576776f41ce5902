"""On-demand dump triggers that work while the main thread is blocked: a signal and a file.

Python runs a signal's handler on the main thread between bytecodes, so ``kill -USR2`` sent
while that thread waits in a collective (C++) would be handled only when the collective returns,
which in a hang is never. The C-level part of Python's handler runs at once, on whichever thread
the kernel picks, and writes the signal's number to the *wakeup fd* (``signal.set_wakeup_fd``).
The watchdog thread waits on that pipe between polls, so the dump starts within milliseconds.

The user's own handler for the signal keeps running (chained, on the main thread as before).
Where the wakeup fd is already taken (an asyncio loop on the main thread), it is left alone and
the signal is seen when the main thread next runs Python, as before.

The file trigger: ``touch <dump_dir>/DUMP_NOW`` on any host; the rank that renames it away first
starts the event (one rename per check, only by each host's local rank 0).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_CHECK_EVERY_SECONDS = 2.0
_WAKE = b"\0"  # no signal has number 0: a byte that only says "look at the stop flag"


class SignalWakeup:
    """Delivers one signal to the watchdog thread's :meth:`wait` and chains the previous handler."""

    def __init__(self, signal_name: str | None) -> None:
        self.signal_name = signal_name
        self._number: int | None = None
        self._previous: Any = None
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._owns_wakeup_fd = False
        self._flag = threading.Event()

    @property
    def delivers_while_blocked(self) -> bool:
        """True when a signal reaches the watchdog thread even while the main thread is blocked."""
        return self._owns_wakeup_fd

    def install(self) -> None:
        """Main thread only (Python's rule for handlers and the wakeup fd); elsewhere a no-op."""
        self._read_fd, self._write_fd = os.pipe()
        for fd in (self._read_fd, self._write_fd):
            os.set_blocking(fd, False)
        if self.signal_name is None or threading.current_thread() is not threading.main_thread():
            return
        number = getattr(signal, self.signal_name)
        self._previous = signal.signal(number, self._handler)
        self._number = number
        try:
            previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            log.warning("set_wakeup_fd failed: %s is seen only when the main thread runs Python",
                        self.signal_name, exc_info=True)
            return
        if previous_fd != -1:  # somebody else's (asyncio): theirs stays, the watchdog takes the slower path
            signal.set_wakeup_fd(previous_fd)
            log.info("the signal wakeup fd is in use: %s is seen only when the main thread runs Python",
                     self.signal_name)
            return
        self._owns_wakeup_fd = True

    def uninstall(self) -> None:
        if threading.current_thread() is threading.main_thread():
            if self._owns_wakeup_fd:
                try:
                    current = signal.set_wakeup_fd(-1)
                    if current not in (-1, self._write_fd):  # replaced after the watchdog's: put theirs back
                        signal.set_wakeup_fd(current)
                except (ValueError, OSError):
                    log.warning("restoring the signal wakeup fd failed", exc_info=True)
                self._owns_wakeup_fd = False
            if self._number is not None:
                try:
                    signal.signal(self._number, self._previous if self._previous is not None else signal.SIG_DFL)
                except (ValueError, OSError, TypeError):
                    log.warning("restoring the %s handler failed", self.signal_name, exc_info=True)
                self._number = None
        self.wake()

    def close(self) -> None:
        """Close the pipe (after the watchdog thread ended and the wakeup fd was given back)."""
        if self._owns_wakeup_fd:
            return  # still registered with Python: closing it would make signals write elsewhere
        for fd in (self._read_fd, self._write_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._read_fd = self._write_fd = None

    def _handler(self, signum: int, frame: Any) -> None:
        """Main thread, whenever it next runs Python."""
        if not self._owns_wakeup_fd:
            self._flag.set()
            self.wake()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def wake(self) -> None:
        """Make a pending :meth:`wait` return now (for stop)."""
        if self._write_fd is not None:
            try:
                os.write(self._write_fd, _WAKE)
            except OSError:  # full pipe: it will wake anyway; closed: nobody waits
                pass

    def wait(self, timeout_seconds: float) -> bool:
        """Sleep up to ``timeout_seconds``; True when the signal arrived meanwhile."""
        if self._read_fd is None:
            return self._flag.wait(timeout_seconds) and _consume(self._flag)
        try:
            readable, _, _ = select.select([self._read_fd], [], [], timeout_seconds)
        except (OSError, ValueError):  # the pipe was closed: the watchdog is stopping
            return False
        got = False
        if readable:
            try:
                data = os.read(self._read_fd, 4096)
            except (BlockingIOError, OSError):
                data = b""
            got = self._number is not None and bytes([self._number]) in data
        return _consume(self._flag) or got


def _consume(flag: threading.Event) -> bool:
    was = flag.is_set()
    flag.clear()
    return was


class FileTrigger:
    """``<dump_dir>/DUMP_NOW``: whoever renames it away first asks for an on-demand dump."""

    def __init__(self, dump_dir: Path, name: str | None, *, checker: bool,
                 every_seconds: float = FILE_CHECK_EVERY_SECONDS) -> None:
        self.path = Path(dump_dir) / name if name else None
        self.checker = checker
        self.every_seconds = every_seconds
        self._next_check = 0.0

    def taken(self, now: float) -> bool:
        """True when this rank took the trigger file (at most one check per ``every_seconds``)."""
        if self.path is None or not self.checker or now < self._next_check:
            return False
        self._next_check = now + self.every_seconds
        claimed = self.path.with_name(f".{self.path.name}.{os.getpid()}.taken")
        try:
            os.rename(self.path, claimed)
        except FileNotFoundError:
            return False
        except OSError:
            log.warning("could not take the dump trigger %s", self.path, exc_info=True)
            return False
        try:
            claimed.unlink()
        except OSError:
            log.warning("could not remove %s", claimed, exc_info=True)
        log.warning("dump requested through %s", self.path)
        return True


def checks_file_trigger() -> bool:
    """Only one rank per host looks for the trigger file (on a shared filesystem, one per host)."""
    return os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) == "0"
