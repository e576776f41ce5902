"""Writing files so that a reader never sees half of one: temporary file, fsync, rename.

The one writer for dumps, summaries and reports. A symlink is written through (its target is
replaced, the link kept); a target that is not a regular file (``/dev/stdout``, a FIFO, a
terminal) is written directly; an existing file keeps its mode, a new one gets the umask's.
Raises OSError.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


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
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """UTF-8; characters it cannot encode (lone surrogates from odd file names) become escapes."""
    return atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
