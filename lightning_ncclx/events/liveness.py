"""Is a rank's process still there? Checked from the same host, through ``/proc``.

A rank that was OOM-killed or crashed never dumps, and without this the summarizing rank waits
``collect_timeout_seconds`` for it (a launcher may kill the job first) and can only say "no dump".
Every watchdog registers ``(rank, pid, process start time)`` under its *scope* once: the kernel's
boot id and the pid namespace, so only processes that can really see each other's ``/proc``
check each other (two containers on one host, or two machines with one hostname, never do).
During an event each rank checks the processes of its own scope. The start time guards against a
reused pid.

Example::

    here = this_process(rank=3)
    gone = [p.rank for p in peers if here and p.scope == here.scope and is_gone(p)]
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass
from typing import Any

from lightning_ncclx.dump.writer import host_name
from lightning_ncclx.events.wire import MAX_PID, as_int, as_safe_name, as_text, json_object


@dataclass(frozen=True)
class ProcessInfo:
    rank: int
    host: str
    pid: int
    start_ticks: int | None
    """Field 22 of ``/proc/<pid>/stat``; None where there is no ``/proc``."""
    scope: str = ""
    """``<boot id>/<pid namespace>``: processes with equal scopes see each other's pids."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str | bytes, world_size: int) -> "ProcessInfo":
        """One line of ``procs/<scope>``, checked (raises :class:`BadValue`): another writer's
        line must not make a rank check an arbitrary pid, or name a rank outside the job."""
        d = json_object(line, 1024, "process line")
        ticks = d.get("start_ticks")
        scope = as_text(d.get("scope", ""), "process scope", 256)
        return cls(as_int(d.get("rank"), "process rank", 0, world_size), as_safe_name(d.get("host"), "process host"),
                   as_int(d.get("pid"), "process id", 1, MAX_PID),
                   None if ticks is None else as_int(ticks, "process start time", 0, 1 << 62), scope)


def _fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from the state letter on, or None without that entry."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of ``pid``, or None when it has no ``/proc`` entry."""
    fields = _fields(pid)
    return None if fields is None else (fields[0], int(fields[19]))


def process_scope() -> str | None:
    """``<boot id>/<pid namespace>`` of this process, or None where Linux's ``/proc`` does not
    tell (then no liveness check is done)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}" if boot and namespace else None


def this_process(rank: int) -> ProcessInfo | None:
    """This process's entry, or None where its liveness cannot be checked by others."""
    scope = process_scope()
    if scope is None:
        return None
    pid = os.getpid()
    try:
        stat = _stat(pid)
    except (OSError, ValueError, IndexError):
        return None
    if stat is None:
        return None
    return ProcessInfo(rank, host_name(), pid, stat[1], scope)


_DEAD_STATES = ("Z", "X", "x")


def _observe(info: ProcessInfo) -> str | None:
    """The process's ``/proc`` state letter; ``""`` when it is gone (exited, a zombie, or its pid
    now belongs to another process); None when that cannot be told."""
    if info.start_ticks is None:
        return None
    try:
        stat = _stat(info.pid)
    except (OSError, ValueError, IndexError):
        return None
    if stat is None or stat[1] != info.start_ticks or stat[0] in _DEAD_STATES:
        return ""
    return stat[0]


def state_of(info: ProcessInfo) -> str | None:
    """The ``/proc`` state letter (R, S, D, T, ...) of ``info``'s process while it is alive;
    None when it is gone or cannot be read."""
    return _observe(info) or None


def wait_status_of(info: ProcessInfo) -> int | None:
    """The wait status (as ``waitpid`` reports it) of ``info``'s process while it is a zombie: it
    exited and its parent has not reaped it yet (field 52 of ``/proc/<pid>/stat``, Linux >= 3.5).
    None for a live process, one already reaped, or where that cannot be read."""
    if info.start_ticks is None:
        return None
    try:
        fields = _fields(info.pid)
        if fields is None or fields[0] != "Z" or int(fields[19]) != info.start_ticks or len(fields) < 50:
            return None
        status = int(fields[49])
    except (OSError, ValueError, IndexError):
        return None
    return status if 0 <= status <= 0xFFFF else None


def describe_wait_status(status: int) -> dict[str, Any]:
    """``{"signal": "SIGABRT", "status": 134}`` for a process killed by a signal (the status as a
    shell reports it, 128 + the signal's number), ``{"signal": None, "status": 1}`` for one that
    exited."""
    number = status & 0x7F
    if number:
        return {"signal": signal_name(number), "status": 128 + number}
    return {"signal": None, "status": (status >> 8) & 0xFF}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def is_gone(info: ProcessInfo) -> bool:
    """True when ``info``'s process has exited (or is a zombie, or its pid now belongs to another
    process). Only meaningful within ``info.scope``; any doubt reads as alive."""
    return _observe(info) == ""


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (of this network
    namespace; read from ``/proc``: False where it cannot be read). Under torchrun: whether the
    agent that launched this rank serves the job's store."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A" and fields[1].rpartition(":")[2] == f"{port:04X}":
                        inodes.add(fields[9])
        except OSError:
            continue
    if not inodes:
        return False
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False
