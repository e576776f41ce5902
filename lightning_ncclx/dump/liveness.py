"""Is a rank's process still there? Checked from the same host, through ``/proc``.

A rank that was OOM-killed or crashed never dumps, and without this the summarizing rank waits
``collect_timeout_seconds`` for it (a launcher may kill the job first) and can only say "no dump".
Every watchdog registers ``(rank, pid, process start time)`` under its host once; during an event
each rank checks the processes of its own host. The start time guards against a reused pid.

Example::

    me = this_process(rank=3)
    gone = [p.rank for p in peers if p.host == me.host and is_gone(p)]
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from lightning_ncclx.dump.writer import host_name


@dataclass(frozen=True)
class ProcessInfo:
    rank: int
    host: str
    pid: int
    start_ticks: int | None
    """Field 22 of ``/proc/<pid>/stat``; None where there is no ``/proc``."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> "ProcessInfo":
        d = json.loads(line)
        ticks = d.get("start_ticks")
        return cls(int(d["rank"]), str(d["host"]), int(d["pid"]), None if ticks is None else int(ticks))


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of ``pid``, or None when it has no ``/proc`` entry."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[19])


def this_process(rank: int) -> ProcessInfo:
    pid = os.getpid()
    try:
        stat = _stat(pid)
    except (OSError, ValueError, IndexError):
        stat = None
    return ProcessInfo(rank, host_name(), pid, stat[1] if stat else None)


def is_gone(info: ProcessInfo) -> bool:
    """True when ``info``'s process has exited (or is a zombie, or its pid now belongs to another
    process). Only meaningful on ``info.host``; any doubt reads as alive."""
    if info.start_ticks is None:
        try:
            os.kill(info.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    try:
        stat = _stat(info.pid)
    except (OSError, ValueError, IndexError):
        return False
    if stat is None:
        return True
    state, ticks = stat
    return state in ("Z", "X", "x") or ticks != info.start_ticks
