"""``lightning-ncclx dump PATH``: every rank of a running job dumps (``ondemand-NNN``), asked for
through the on-demand file, so no signal and no pid are needed (``srun --overlap``, ``kubectl
exec``, another node sharing the folder).

Exit 0 the job took the request; 1 nobody took it within ``--wait`` seconds (the request is
withdrawn); 2 bad input (no such folder, several running jobs under PATH, a folder that cannot be
written)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from lightning_ncclx.config import WatchdogConfig
from lightning_ncclx.dump.request import (
    ondemand_folders, running_dump_folders, wait_for_new_event, wait_until_taken, withdraw, write_request,
)
from lightning_ncclx.exit_status import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK
from lightning_ncclx.report.escape import terminal_safe

DEFAULT_REQUEST_NAME = WatchdogConfig().on_demand_file or "DUMP_NOW"
MAX_WAIT_SECONDS = 3600.0
EVENT_WAIT_SECONDS = 20.0
"""After the request was taken: how long to wait for the event folder to appear, to name it."""


def _say(message: str, *, error: bool = False) -> None:
    print(terminal_safe(f"lightning-ncclx dump: {message}" if error else message),
          file=sys.stderr if error else sys.stdout)


def _target(path: Path) -> Path | None:
    if not path.exists():
        _say(f"no such folder: {path}", error=True)
        return None
    if not path.is_dir():
        _say(f"not a folder: {path} (give the run's folder or its dump folder)", error=True)
        return None
    running = running_dump_folders(path)
    if len(running) > 1:
        _say(f"{len(running)} running jobs write dumps under {path}: " + ", ".join(map(str, running))
             + "; give one of these folders", error=True)
        return None
    return running[0] if running else path


def run_dump(path: Path, name: str = DEFAULT_REQUEST_NAME, wait_seconds: float = 15.0) -> int:
    if not math.isfinite(wait_seconds) or wait_seconds < 0 or wait_seconds > MAX_WAIT_SECONDS:
        _say(f"--wait {wait_seconds} is not a number of seconds from 0 to {MAX_WAIT_SECONDS:g}", error=True)
        return EXIT_BAD_INPUT
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        _say(f"--file {name!r} is not a plain file name", error=True)
        return EXIT_BAD_INPUT
    target = _target(path)
    if target is None:
        return EXIT_BAD_INPUT
    before = ondemand_folders(target)
    request = target / name
    try:
        fresh = write_request(target, name)
    except OSError as err:
        _say(f"cannot write the request {request}: {err.strerror or err}", error=True)
        return EXIT_BAD_INPUT
    if not fresh:
        _say(f"a request is already waiting in {request}")
    if wait_seconds <= 0:
        _say(f"requested: {request} (each host's local rank 0 looks for it every 2 s)")
        return EXIT_OK
    if not wait_until_taken(request, wait_seconds) and withdraw(request):
        _say(f"no running job took {request} within {wait_seconds:g} s, so it was withdrawn: is a job writing to "
             f"{target}, with on_demand_file={name}? (the watchdog looks for it only while it runs)", error=True)
        return EXIT_FINDING
    event = wait_for_new_event(target, before, EVENT_WAIT_SECONDS)
    if event is None:
        _say(f"the job took {request}, but no new ondemand-* folder appeared under {target} within "
             f"{EVENT_WAIT_SECONDS:g} s: a request within 5 s of the job's last on-demand dump, or past its "
             "max_on_demand_dumps, is ignored (the rank's log says so); with node-local dump folders each host "
             "writes its own")
    else:
        _say(f"the job took the request: every rank dumps into {target / event}")
    return EXIT_OK
