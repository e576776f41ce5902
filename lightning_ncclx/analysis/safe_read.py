"""Every byte the analyzer reads from disk comes through here: regular files only, capped sizes.

A dump folder is untrusted: a FIFO named like a dump must not block, ``/dev/zero`` behind a
symlink must not be read forever, a 2 GiB file must not be slurped. Files are opened with
``O_NONBLOCK`` (opening a FIFO never waits) and checked with ``fstat`` on the open descriptor,
so a file swapped after the check is still the one checked.
"""

from __future__ import annotations

import os
import resource
import stat
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from lightning_ncclx.errors import DumpReadError

MAX_TRACE_BYTES = 512 << 20
"""A flight-recorder dump larger than this is refused (20,000 entries with stacks are ~30 MiB)."""
MAX_SIDE_FILE_BYTES = 16 << 20
"""context.json, stacks.txt, collection.json."""
MAX_TOTAL_BYTES = 32 << 30
"""All dumps of one folder together (1024 ranks x 2000 entries with stacks: ~2 GiB)."""
SNIFF_BYTES = 16
_MORE = 1 << 16
"""Bytes asked for per read once the size ``fstat`` gave has been read (the file grew, or its end is next)."""

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def human_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.1f} {unit}" if value < 10 and value != int(value) else f"{int(value)} {unit}"
    return f"{n} bytes"


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO")."""
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return words
    return "not a regular file"


def read_regular(path: str | os.PathLike, cap: int, what: str = "file", limit: int | None = None) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``cap`` bytes, else DumpReadError
    saying why ("a FIFO", "1.9 GiB, over the 512 MiB cap"). ``limit``: read only that many bytes
    (sniffing), whatever the size."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise DumpReadError(f"cannot open {what}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DumpReadError(f"{what} is {file_kind(st.st_mode)}, not a regular file: not read")
        if limit is None and st.st_size > cap:
            raise DumpReadError(f"{what} is {human_bytes(st.st_size)}, over the {human_bytes(cap)} cap")
        want = min(limit, cap) if limit is not None else cap
        chunks, got = [], 0
        step = min(want + 1, st.st_size + 1) if st.st_size else _MORE
        while got <= want:  # the size may have changed since fstat: never read past the cap
            chunk = os.read(fd, max(1, min(step, want + 1 - got)))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            step = _MORE  # past what fstat said: a buffer the file's size again only to meet its end cost 10x the read
        data = b"".join(chunks)
        if limit is None and len(data) > cap:
            raise DumpReadError(f"{what} grew past the {human_bytes(cap)} cap while being read")
        return data[:want] if limit is not None else data
    except OSError as exc:
        raise DumpReadError(f"cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


DECODE_BUDGET_BYTES = 640 << 20
"""Address space one dump may take while it is decoded and compacted, its raw bytes included: a
reader stays under 1 GiB whatever a file holds (a JSON dump is read newest entries only; a pickle
that needs more is unreadable, "needs more than the memory cap")."""


@contextmanager
def bounded_memory(extra_bytes: int) -> Iterator[None]:
    """Lower this process's address-space limit to its current size + ``extra_bytes`` while the
    block runs, so a hostile pickle (a memo index of 10**8 allocates gigabytes from 7 bytes) ends
    in MemoryError instead of swapping. Only where it cannot hurt anyone else: Linux, no other
    thread (a training job's NCCL or loader threads must never see a lowered limit)."""
    if sys.platform != "linux" or threading.active_count() > 1:
        yield
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm", "rb") as fh:
            vm_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        yield
        return
    limit = vm_bytes + extra_bytes
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield
        return
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
