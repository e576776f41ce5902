"""An on-demand dump asked for from outside the job, with no signal: the request file.

Each host's local rank 0 renames ``<dump_dir>/DUMP_NOW`` away within 2 s and every rank dumps
(``ondemand-NNN``). :func:`running_dump_folders` finds the dump folder of a running job under a
run folder: while a watchdog runs (with ``native_stacks`` on, the default) its folder holds each
rank's hidden ``.rank_NNNNN.native-stacks.txt``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lightning_ncclx.dump.location import DUMPS_FOLDER_NAME
from lightning_ncclx.layout import NATIVE_STACKS_SUFFIX

ONDEMAND_PREFIX = "ondemand-"


def _is_running_dump_folder(folder: Path) -> bool:
    try:
        return any(child.name.startswith(".rank_") and child.name.endswith(f".{NATIVE_STACKS_SUFFIX}")
                   for child in folder.iterdir())
    except OSError:
        return False


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(child for child in folder.iterdir() if child.is_dir() and not child.is_symlink())
    except OSError:
        return []


def running_dump_folders(path: Path) -> list[Path]:
    """Dump folders of running jobs at ``path``: itself, ``ncclx_dumps*`` in it, and one level
    below either (``<root>/ncclx_dumps/<run id>``)."""
    candidates = [path]
    for child in _subfolders(path):
        candidates.append(child)
        if child.name.startswith(DUMPS_FOLDER_NAME):
            candidates.extend(_subfolders(child))
    return [folder for folder in candidates if _is_running_dump_folder(folder)]


def ondemand_folders(dump_dir: Path) -> set[str]:
    return {child.name for child in _subfolders(dump_dir) if child.name.startswith(ONDEMAND_PREFIX)}


def write_request(dump_dir: Path, name: str) -> bool:
    """Create ``<dump_dir>/<name>``; False when a request is already waiting there. Raises
    OSError when the folder cannot be written."""
    try:
        fd = os.open(dump_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as request:
        request.write(f"dump requested at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} by pid {os.getpid()}\n")
    return True


def wait_until_taken(request: Path, seconds: float, poll_seconds: float = 0.2) -> bool:
    """True once the watchdog has renamed the request away (within ``seconds``)."""
    deadline = time.monotonic() + seconds
    while os.path.lexists(request):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_seconds)
    return True


def withdraw(request: Path) -> bool:
    """Remove a request nobody took; False when it was taken meanwhile."""
    try:
        request.unlink()
    except FileNotFoundError:
        return False
    return True


def wait_for_new_event(dump_dir: Path, before: set[str], seconds: float, poll_seconds: float = 0.2) -> str | None:
    """The name of an ``ondemand-*`` folder that was not in ``before``, once it appears."""
    deadline = time.monotonic() + seconds
    while True:
        new = sorted(ondemand_folders(dump_dir) - before)
        if new:
            return new[0]
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_seconds)
