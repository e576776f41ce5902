"""Writing files so that a reader never sees half of one: temporary file, fsync, rename.

The one writer for dumps, summaries and reports. An existing file keeps its mode; a path that is
a symlink to something that is not a regular file (``/dev/stdout``) is written through, not
replaced.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    path = Path(path)
    try:
        target = path.stat()
    except OSError:
        target = None
    if target is not None and not stat.S_ISREG(target.st_mode):
        with open(path, "wb") as handle:  # a device or pipe (/dev/stdout): write through it
            handle.write(data)
        return path
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if target is not None:
            os.chmod(tmp, stat.S_IMODE(target.st_mode))
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))
