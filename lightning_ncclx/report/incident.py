"""What makes an incident folder self-describing: the run and job it came from, its hosts and
times, stored as ``incident`` in its ``summary.json`` (read by ``lightning-ncclx history``).

The identity is taken once, when the event is first summarized, and kept when the same folder
is summarized again later (from another shell, without the job's environment)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lightning_ncclx.analysis.model import Summary
from lightning_ncclx.analysis.safe_read import MAX_SIDE_FILE_BYTES, read_regular
from lightning_ncclx.errors import DumpReadError

_CONTEXT = re.compile(r"rank_\d+\.context\.json$")
_JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "TORCHELASTIC_RUN_ID")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="seconds")


def _dump_times(folder: Path) -> list[float]:
    times = []
    try:
        names = [p for p in folder.iterdir() if _CONTEXT.match(p.name)]
    except OSError:
        return []
    for path in names[:4096]:
        try:
            value = json.loads(read_regular(path, MAX_SIDE_FILE_BYTES, "context")).get("time_unix")
        except (DumpReadError, ValueError, AttributeError, RecursionError):  # a FIFO must not block
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e11:  # before year 5138
            times.append(float(value))
    return times


def incident_info(summary: Summary, folder: Path, environ: Mapping[str, str] | None = None,
                  now: float | None = None) -> dict[str, Any]:
    """The ``incident`` block for ``summary`` written into ``folder``."""
    from lightning_ncclx.layout import run_id_from_environment

    env = os.environ if environ is None else environ
    times = _dump_times(folder)
    job_id = next((env[v] for v in _JOB_VARIABLES if env.get(v) and env.get(v) != "none"), None)
    now = datetime.now(UTC).timestamp() if now is None else now
    return {
        "event": str(summary.context.get("event") or folder.name),
        "run_id": run_id_from_environment(dict(env)) or _run_folder(folder).name,
        "job_id": job_id,
        "hosts": sorted(set(summary.hosts.values())),
        "dumped_at": _iso(min(times)) if times else None,
        "summarized_at": _iso(now),
        "folder": str(folder.absolute()),
    }


def _run_folder(event_folder: Path) -> Path:
    """``<run>/ncclx_dumps/<event>`` (Hydra) or ``.../ncclx_dumps/<run id>/<event>``."""
    parent = event_folder.absolute().parent
    return parent.parent if parent.name == "ncclx_dumps" else parent


def kept_incident(folder: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """The identity already in ``folder/summary.json`` for the same event (first write wins),
    else ``fresh``."""
    try:
        old = json.loads(read_regular(folder / "summary.json", MAX_SIDE_FILE_BYTES, "summary.json")).get("incident")
    except (DumpReadError, ValueError, AttributeError, RecursionError):
        return fresh
    if isinstance(old, dict) and old.get("event") == fresh["event"]:
        return {**fresh, **{k: v for k, v in old.items() if v is not None}, "summarized_at": fresh["summarized_at"]}
    return fresh
