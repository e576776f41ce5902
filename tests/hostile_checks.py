"""What a hostile-store test asserts afterwards: nothing written outside the dump folder, and how
much memory each rank took.

``Sandbox``: the job's dump folder is a subfolder of a sandbox that also holds the job's HOME
(with bait such as ``.ssh/authorized_keys``); a snapshot before and after shows every file
created, changed or removed anywhere in it but the dump folder.

Peak memory: ``PeakRss`` polls ``VmHWM`` (the kernel's high-water mark of a process's resident
memory) of a job's processes while they run; ``peak_rss_wrapped`` runs a job under a small
wrapper that reaps every process of it and reports the largest ``ru_maxrss`` (exact, also for a
spike just before exit, but one figure for the whole job).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

Snapshot = dict[str, tuple]
"""Relative path -> (kind, size, mtime_ns, mode, link target) of everything under a folder."""

BAIT_FILES = {"home/.ssh/authorized_keys": "ssh-ed25519 AAAA-the-owners-key owner@host\n",
              "home/.bashrc": "# the owner's shell setup\n"}


@dataclass(frozen=True)
class Sandbox:
    root: Path
    home: Path
    dump_dir: Path

    @classmethod
    def create(cls, parent: Path) -> "Sandbox":
        root = parent / "sandbox"
        for name, text in BAIT_FILES.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        (root / "dumps").mkdir()
        return cls(root, root / "home", root / "dumps")

    def env(self) -> dict[str, str]:
        """For the job: its HOME (and the caches under it) inside the sandbox."""
        return {"HOME": str(self.home), "XDG_CACHE_HOME": str(self.home / ".cache")}

    def snapshot(self) -> Snapshot:
        return snapshot(self.root)

    def written_outside(self, before: Snapshot, allowed: Iterable[Path] = ()) -> list[str]:
        """Changes since ``before`` outside the dump folder and ``allowed``: ``+ new``,
        ``- removed``, ``~ changed`` (relative to the sandbox)."""
        inside = [os.path.relpath(p, self.root) for p in (self.dump_dir, *allowed)]
        return [line for line in changes(before, self.snapshot())
                if not any(_is_within(line[2:], folder) for folder in inside)]


def snapshot(root: Path) -> Snapshot:
    """Every entry under ``root`` (links not followed)."""
    found: Snapshot = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
            target = os.readlink(path) if kind == "link" else ""
            size, mtime = (0, 0) if kind == "dir" else (st.st_size, st.st_mtime_ns)
            found[os.path.relpath(path, root)] = (kind, size, mtime, stat.S_IMODE(st.st_mode), target)
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    lines = [f"+ {p}" for p in sorted(set(after) - set(before))]
    lines += [f"- {p}" for p in sorted(set(before) - set(after))]
    lines += [f"~ {p}" for p in sorted(set(before) & set(after)) if before[p] != after[p]]
    return lines


def _is_within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# ---------------------------------------------------------------------------------- memory
def vm_hwm_bytes(pid: int) -> int | None:
    """The peak resident memory of ``pid`` so far; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children of each of its threads, recursively)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            found.extend(children)
            pending.extend(children)
    return found


def rank_of(pid: int) -> int | None:
    """The ``RANK`` (else ``LOCAL_RANK``) a process was started with; None when it has neither
    (the launching rank 0 of Lightning's launcher) or is gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    value = env.get(b"RANK", env.get(b"LOCAL_RANK"))
    return int(value) if value is not None and value.isdigit() else None


class PeakRss:
    """Polls the VmHWM of ``root_pid`` and its descendants until :meth:`stop`; ``peaks`` maps
    pid -> bytes (a lower bound: what a process reached after the last poll is not seen)."""

    def __init__(self, root_pid: int, poll_seconds: float = 0.05) -> None:
        self.root_pid = root_pid
        self.peaks: dict[int, int] = {}
        self.ranks: dict[int, int | None] = {}
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._poll_seconds)

    def poll(self) -> None:
        for pid in [self.root_pid, *descendants(self.root_pid)]:
            peak = vm_hwm_bytes(pid)
            if peak is not None:
                self.peaks[pid] = max(peak, self.peaks.get(pid, 0))
                if pid not in self.ranks:
                    self.ranks[pid] = rank_of(pid)

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join()
        return dict(self.peaks)


_WRAPPER = r"""
import ctypes, json, os, resource, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphaned ranks come back here
code = subprocess.call(sys.argv[2:])
while True:  # reap every process of the job that outlived its parent
    try:
        os.wait()
    except ChildProcessError:
        break
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
with open(sys.argv[1], "w") as handle:
    json.dump({"peak_rss_bytes": peak, "returncode": code}, handle)
sys.exit(code if code >= 0 else 128 - code)
"""


def peak_rss_wrapped(argv: Sequence[str], report: Path) -> list[str]:
    """``argv`` run under a wrapper that writes ``{"peak_rss_bytes", "returncode"}`` to
    ``report`` once every process of the job has ended: the largest peak RSS among them."""
    return [sys.executable, "-c", _WRAPPER, str(report), *argv]


def read_peak_rss(report: Path) -> int:
    return int(json.loads(report.read_text())["peak_rss_bytes"])
