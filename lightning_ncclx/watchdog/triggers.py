"""On-demand dump triggers that work while the main thread is blocked: a signal and a file.

Python runs a signal's handler on the main thread between bytecodes, so ``kill -USR2`` sent
while that thread waits in a collective (C++) would be handled only when the collective returns,
which in a hang is never. The C-level part of Python's handler runs at once, on whichever thread
the kernel picks, and writes the signal's number to the *wakeup fd* (``signal.set_wakeup_fd``).
The watchdog thread waits on that pipe between polls, so the dump starts within milliseconds.

What was there before is what is there after, and keeps working meanwhile:

- a Python handler of the user's keeps running (chained, on the main thread as before);
- a handler set in C (``faulthandler.register(SIGUSR2)``, a native library), which Python's
  table does not show and ``signal.signal`` could not put back, is left alone: the signal then
  is not a dump trigger in this process (the trigger file still is);
- native code that later resets the signal to its default action, which ends the process
  (``torch._C._set_print_stack_traces_on_fatal_signal(False)`` puts back the SIG_DFL that c10's
  handler found), is undone: :meth:`SignalWakeup.keep_armed`, called between steps and at every
  watchdog poll, puts the watchdog's handler (back) and logs it once;
- a handler installed after the watchdog's, in Python or in C, stays when the watchdog stops;
- the wakeup fd is taken only when none is set (an asyncio loop's stays), and given back only
  while it is still the watchdog's (see :mod:`process_signals`).

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

from lightning_ncclx.watchdog.process_signals import (
    KernelAction, give_back_wakeup_fd, handler_library, read_action, take_wakeup_fd, write_action,
)

log = logging.getLogger(__name__)

FILE_CHECK_EVERY_SECONDS = 2.0
_WAKE = b"\0"  # no signal has number 0: a byte that only says "look at the stop flag"


class SignalWakeup:
    """Delivers one signal to the watchdog thread's :meth:`wait`; the handler it found keeps working."""

    def __init__(self, signal_name: str | None) -> None:
        self.signal_name = signal_name
        self._number: int | None = None
        """The signal's number while this object's handler is installed and in use."""
        self._previous: Any = None
        self._kernel_before: KernelAction | None = None
        self._python_action: KernelAction | None = None
        """The kernel's action once the watchdog's handler is installed (Python's C handler)."""
        self._left_to_native = False
        """A handler set outside Python held the signal at install: left alone until it goes."""
        self._reset_logged = False
        self._lock = threading.Lock()
        self._python_handler_address: int | None = None
        """The kernel's handler once the watchdog's is installed: Python's C function, the same for every signal."""
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._owns_wakeup_fd = False
        self._flag = threading.Event()
        self._installed_handler = self._handler  # one bound method, so that `is` finds it in Python's table

    @property
    def handler(self) -> Any:
        """The handler object the watchdog puts in Python's table (the same object for its lifetime)."""
        return self._installed_handler

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
        if self._take_signal(number):
            self._arm(number)

    def _arm(self, number: int) -> None:
        with self._lock:
            self._number = number
        try:
            self._owns_wakeup_fd = take_wakeup_fd(self._write_fd)
        except (ValueError, OSError):
            log.warning("set_wakeup_fd failed: %s is seen only when the main thread runs Python",
                        self.signal_name, exc_info=True)
            return
        if not self._owns_wakeup_fd:  # somebody else's (asyncio): theirs stays, the watchdog takes the slower path
            log.info("the signal wakeup fd is in use: %s is seen only when the main thread runs Python",
                     self.signal_name)

    def _take_signal(self, number: int) -> bool:
        """Install the handler unless the signal has one Python could not put back."""
        python_view = signal.getsignal(number)
        before = read_action(number)
        if python_view is None or (before is not None and _is_default_or_ignore(python_view)
                                   and before.handler != int(python_view)):
            self._leave_alone(before)
            return False
        self._previous = signal.signal(number, self._installed_handler)
        after = read_action(number) if before is not None else None
        if after is not None and not _is_default_or_ignore(python_view) and after.handler != before.handler:
            # a C handler sat over the user's Python one (faulthandler.register after signal.signal)
            signal.signal(number, python_view)
            write_action(number, before)
            self._leave_alone(after)
            return False
        self._kernel_before = before
        self._python_action = after
        self._python_handler_address = after.handler if after is not None else None
        self._left_to_native = False
        return True

    def _leave_alone(self, held_by: KernelAction | None) -> None:
        self._left_to_native = True
        where = _holder(held_by.handler) if held_by is not None else None
        log.warning("%s has a handler set outside Python (%s): it is left in place, and %s does not start a dump "
                    "in this process; `lightning-ncclx dump <dump folder>` or the on-demand file does (and %s does "
                    "again if that handler is removed later)", self.signal_name,
                    f"in {where}" if where else "faulthandler.register or a native library", self.signal_name,
                    self.signal_name)

    def keep_armed(self) -> None:
        """Cheap (one ``sigaction`` read), from any thread. Where the signal's action is back at
        its default, which ends the process, because native code reset it after the watchdog's
        handler went in, put that handler back (any thread: the kernel's action alone is
        rewritten, Python's table still names it). Where a native handler held the signal at
        install and has gone since, take the signal now (main thread only: Python's rule)."""
        if self.signal_name is None or (self._number is None and not self._left_to_native):
            return
        number = getattr(signal, self.signal_name)
        now = read_action(number)
        if now is None or now.handler != int(signal.SIG_DFL):
            return
        if self._number is not None:
            self._put_back(number)
        elif threading.current_thread() is threading.main_thread() and signal.getsignal(number) in (signal.SIG_DFL, None):
            self._take_after_native(number)

    def _put_back(self, number: int) -> None:
        with self._lock:
            if self._number is None or self._python_action is None:
                return
            if signal.getsignal(number) is not self._installed_handler:
                return  # Python code chose another handler (SIG_DFL included): its choice stands
            if not write_action(number, self._python_action):
                return
        if not self._reset_logged:
            self._reset_logged = True
            log.warning("%s was reset to its default action (which ends the process) outside Python after the "
                        "watchdog's handler was installed (a native library): the handler is put back, and %s "
                        "starts a dump", self.signal_name, self.signal_name)

    def _take_after_native(self, number: int) -> None:
        self._kernel_before = read_action(number)
        self._previous = signal.signal(number, self._installed_handler)
        if self._previous is None:  # set outside Python at start-up: SIG_DFL is what stood there now
            self._previous = signal.SIG_DFL
        self._left_to_native = False
        self._python_action = read_action(number)
        self._python_handler_address = self._python_action.handler if self._python_action is not None else None
        self._arm(number)
        log.warning("the handler set outside Python for %s was removed, leaving the default action (which ends "
                    "the process): the watchdog's handler is installed, and %s starts a dump",
                    self.signal_name, self.signal_name)

    def uninstall(self) -> None:
        """Give back the handler and the wakeup fd, each only while it is still the watchdog's (main thread)."""
        if threading.current_thread() is threading.main_thread():
            if self._owns_wakeup_fd and self._write_fd is not None:
                try:
                    if not give_back_wakeup_fd(self._write_fd):
                        log.info("the signal wakeup fd was replaced after the watchdog's: left in place")
                except (ValueError, OSError):
                    log.warning("giving back the signal wakeup fd failed", exc_info=True)
                self._owns_wakeup_fd = False
            with self._lock:
                if self._number is not None:
                    self._give_back_signal(self._number)
                    self._number = None
            self._left_to_native = False
        self.wake()

    def _give_back_signal(self, number: int) -> None:
        try:
            if signal.getsignal(number) is not self._installed_handler:
                log.info("the %s handler was replaced after the watchdog's: left in place", self.signal_name)
                return
            now = read_action(number) if self._python_handler_address is not None else None
            if now is not None and now.handler != self._python_handler_address:
                log.info("a handler set outside Python replaced the watchdog's %s handler: left in place",
                         self.signal_name)
                return
            signal.signal(number, self._previous)
            if self._kernel_before is not None:
                write_action(number, self._kernel_before)  # the same handler; its flags and mask as they were
        except (ValueError, OSError, TypeError):
            log.warning("restoring the %s handler failed", self.signal_name, exc_info=True)

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
        """Main thread, whenever it next runs Python. Once uninstalled it only passes the signal
        on: a handler installed after it may still call it."""
        if self._number is not None and not self._owns_wakeup_fd:
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
            number = self._number
            got = number is not None and bytes([number]) in data
        return _consume(self._flag) or got


def describe_signal(signal_name: str) -> tuple[str, bool]:
    """What the on-demand signal would do in this process now, and whether a handler set outside
    Python holds it (then it starts no dump while that handler stays), for ``doctor``."""
    number = getattr(signal, signal_name)
    python_view = signal.getsignal(number)
    kernel = read_action(number)
    if kernel is None:
        return f"{signal_name}: its action cannot be read on this platform", False
    if kernel.handler == int(signal.SIG_DFL):
        return f"{signal_name}: default action (ends the process); the watchdog's handler makes it a dump trigger", False
    if kernel.handler == int(signal.SIG_IGN):
        return f"{signal_name}: ignored here; the watchdog's handler makes it a dump trigger", False
    if python_view is not None and not _is_default_or_ignore(python_view):
        return f"{signal_name}: a Python handler ({python_view!r}); the watchdog's runs before it", False
    where = _holder(kernel.handler) or f"address 0x{kernel.handler:x}"
    return (f"{signal_name}: a handler set outside Python holds it here (in {where}): it starts no dump while that "
            f"handler stays; `lightning-ncclx dump <dump folder>` or `touch <dump folder>/DUMP_NOW` does, "
            f"or on_demand_signal: SIGUSR1"), True


def _holder(address: int) -> str | None:
    library = handler_library(address)
    if library is not None and library.startswith(("python", "libpython")):
        return f"{library}: faulthandler.register or another C handler of the interpreter"
    return library


def _is_default_or_ignore(handler: Any) -> bool:
    return handler is signal.SIG_DFL or handler is signal.SIG_IGN


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
        self._failing: str | None = None
        """Why the last check failed (logged once per reason, not at every check)."""

    def taken(self, now: float) -> bool:
        """True when this rank took the trigger file (at most one check per ``every_seconds``)."""
        if self.path is None or not self.checker or now < self._next_check:
            return False
        self._next_check = now + self.every_seconds
        claimed = self.path.with_name(f".{self.path.name}.{os.getpid()}.taken")
        try:
            os.rename(self.path, claimed)
        except FileNotFoundError:
            self._failing = None
            return False
        except OSError as error:
            reason = f"{type(error).__name__}: {error.strerror or error}"
            if reason != self._failing:
                log.error("the dump folder %s cannot be used (%s): %s is not looked for until it can; fix "
                          "flight_recorder.dump_dir or its permissions", self.path.parent, reason, self.path.name)
            self._failing = reason
            return False
        self._failing = None
        try:
            claimed.unlink()
        except OSError:
            log.warning("could not remove %s", claimed, exc_info=True)
        log.warning("dump requested through %s", self.path)
        return True


def checks_file_trigger() -> bool:
    """Only one rank per host looks for the trigger file (on a shared filesystem, one per host)."""
    return os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) == "0"
