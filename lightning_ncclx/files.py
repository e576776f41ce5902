"""Writing files so that a reader never sees half of one: temporary file, fsync, rename.

The one writer for dumps, summaries and reports. A symlink is written through (its target is
replaced, the link kept); a target that is not a regular file (``/dev/stdout``, a FIFO, a
terminal) is written directly; an existing file keeps its mode, a new one gets the mode any new
file gets there (0o666 less the umask, or the folder's default ACL), applied by the kernel: the
process-wide umask is never changed (that would give another thread's new files other modes).
Raises OSError.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

_TEMPORARY_NAME_TRIES = 100


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    path = Path(path)
    try:
        st = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as handle:  # /dev/stdout, a pipe or terminal: no rename possible
            handle.write(data)
        return path
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    real.parent.mkdir(parents=True, exist_ok=True)
    kept_mode = stat.S_IMODE(st.st_mode) if st is not None else None
    fd, tmp = _new_temporary_file(real, 0o666 if kept_mode is None else kept_mode & 0o777)
    try:
        with os.fdopen(fd, "wb") as handle:
            if kept_mode is not None:
                os.fchmod(handle.fileno(), kept_mode)  # before the data: never wider than the file's own
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, real)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """UTF-8; characters it cannot encode (lone surrogates from odd file names) become escapes."""
    return atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"))


def _new_temporary_file(real: Path, mode: int) -> tuple[int, Path]:
    """``.<name>.<random>.tmp`` next to ``real``, created with ``mode`` for the kernel to apply
    the umask to (``mkstemp`` creates 0o600, and reading the umask means setting it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMPORARY_NAME_TRIES):
        tmp = real.with_name(f".{real.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(real.parent))
