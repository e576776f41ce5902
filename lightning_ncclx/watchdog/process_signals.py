"""Process-wide signal state that Python's ``signal`` module cannot show, read and put back.

Python keeps its own table of handlers: ``signal.getsignal`` answers from that table, not from
the kernel. A handler installed in C (``faulthandler.register``, a native library) is invisible
there: after ``faulthandler.register(SIGUSR2)`` the table still says ``SIG_DFL``, and restoring
"what ``signal.signal`` returned" would install ``SIG_DFL`` over faulthandler's handler. The
kernel's action for a signal is read and written here through libc's ``sigaction``, as an opaque
``struct sigaction`` (handler, flags and mask come back exactly as they were).

Python has no getter for the wakeup fd either (``signal.set_wakeup_fd`` only swaps): a spare pipe
stands in while looking, and a signal's byte that lands there meanwhile is passed on to the fd it
was meant for, so the owner of the wakeup fd never misses one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import signal
import struct
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

log = logging.getLogger(__name__)

_SIGACTION_BUFFER_BYTES = 512
"""More than ``sizeof(struct sigaction)`` on every libc (152 bytes on 64-bit glibc and musl)."""
_HANDLER_FIRST_MACHINES = frozenset({"x86_64", "amd64", "aarch64", "arm64", "ppc64le", "ppc64", "s390x", "riscv64"})
"""Where ``struct sigaction`` starts with the handler (MIPS puts ``sa_flags`` first)."""


@dataclass(frozen=True)
class KernelAction:
    """One signal's action as the kernel holds it: ``handler`` is 0 for SIG_DFL, 1 for SIG_IGN,
    else the address of a C function (Python's own for a handler set with ``signal.signal``)."""

    raw: bytes
    handler: int


def read_action(signum: int) -> KernelAction | None:
    """The kernel's action for ``signum``; None where libc cannot be asked on this platform."""
    sigaction = _libc_sigaction()
    if sigaction is None:
        return None
    buffer = ctypes.create_string_buffer(_SIGACTION_BUFFER_BYTES)
    if sigaction(signum, None, buffer) != 0:
        log.debug("sigaction(%d) failed: errno %d", signum, ctypes.get_errno())
        return None
    (handler,) = struct.unpack_from("P", buffer.raw, 0)
    return KernelAction(buffer.raw, handler)


def write_action(signum: int, action: KernelAction) -> bool:
    """Put back an action :func:`read_action` returned; False when libc refused."""
    sigaction = _libc_sigaction()
    if sigaction is None:
        return False
    buffer = ctypes.create_string_buffer(action.raw, _SIGACTION_BUFFER_BYTES)
    if sigaction(signum, buffer, None) != 0:
        log.warning("restoring the action of signal %d failed: errno %d", signum, ctypes.get_errno())
        return False
    return True


_LIBC_SIGACTION: list = []


def _libc_sigaction():  # noqa: ANN202 - a ctypes function pointer
    if not _LIBC_SIGACTION:
        _LIBC_SIGACTION.append(_load_sigaction())
    return _LIBC_SIGACTION[0]


def _load_sigaction():  # noqa: ANN202
    if sys.platform not in ("linux", "darwin") or platform.machine().lower() not in _HANDLER_FIRST_MACHINES:
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sigaction
    except (OSError, AttributeError):
        log.debug("libc's sigaction is not reachable through ctypes", exc_info=True)
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


# ---------------------------------------------------------------------------------- wakeup fd
def take_wakeup_fd(write_fd: int) -> bool:
    """Make ``write_fd`` Python's wakeup fd if none is set (True); one that is set stays (False).

    Main thread only. The fd that was set is put back with Python's default
    ``warn_on_full_buffer`` (asyncio's choice): the flag it had cannot be read."""
    with _spare_in_the_slot() as (current, pass_on_to):
        if current == -1:
            signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            pass_on_to(write_fd)
            return True
        signal.set_wakeup_fd(current)
        pass_on_to(current)
        return False


def give_back_wakeup_fd(write_fd: int) -> bool:
    """Unset ``write_fd`` if it still is the wakeup fd (True); one set after it stays (False)."""
    with _spare_in_the_slot() as (current, pass_on_to):
        if current == write_fd:
            signal.set_wakeup_fd(-1)
            return True
        signal.set_wakeup_fd(current)
        pass_on_to(current)
        return False


@contextmanager
def _spare_in_the_slot() -> Iterator[tuple[int, Callable[[int], None]]]:
    """Swap a spare pipe in as the wakeup fd; yield (the fd it replaced, a function that passes
    the bytes the spare caught on to an fd). The caller sets the final fd; if it raises, the
    slot is emptied rather than left pointing at a pipe about to be closed."""
    spare_read, spare_write = os.pipe()
    try:
        for fd in (spare_read, spare_write):
            os.set_blocking(fd, False)
        current = signal.set_wakeup_fd(spare_write, warn_on_full_buffer=False)
        try:
            yield current, lambda target: _pass_on(spare_read, target)
        except BaseException:
            signal.set_wakeup_fd(-1)
            raise
    finally:
        os.close(spare_read)
        os.close(spare_write)


def _pass_on(source: int, target: int) -> None:
    while True:
        try:
            data = os.read(source, 4096)
        except BlockingIOError:
            return
        if not data:
            return
        try:
            os.write(target, data)
        except OSError:  # its buffer is full: Python would have dropped these bytes as well
            return


# ---------------------------------------------------------------------------- who holds it
class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def handler_library(address: int) -> str | None:
    """The shared object a C handler's address lies in (``libc10.so``), through ``dladdr``."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.basename(info.dli_fname.decode(errors="replace"))
