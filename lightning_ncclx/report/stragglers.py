"""The straggler table ``lightning-ncclx summarize`` prints from ``stragglers.json`` (written by
live straggler detection, :mod:`lightning_ncclx.straggler`; format in that package's report
module). The file is read like every other input: a regular file under a size cap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_ncclx.analysis.safe_read import read_regular
from lightning_ncclx.errors import DumpReadError
from lightning_ncclx.layout import STRAGGLERS_FILE

FORMAT_VERSION = 1
MAX_BYTES = 16 << 20
PART_LABELS = {"data_fetch": "data fetch", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}


def _load(path: Path) -> dict[str, Any]:
    data = json.loads(read_regular(path, MAX_BYTES, STRAGGLERS_FILE))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def find_document(path: Path) -> Path | None:
    """``stragglers.json`` in ``path`` (a run's dump folder) or its parent (``path`` is an event folder)."""
    path = Path(path)
    for folder in (path, path.parent) if path.is_dir() else (path.parent,):
        candidate = folder / STRAGGLERS_FILE
        if candidate.is_file():
            return candidate
    return None


def render_lines(document: dict[str, Any], most: int = 5) -> list[str]:
    """The straggler table for a text report (empty for an unknown version)."""
    if document.get("version") != FORMAT_VERSION:
        return []
    incidents = document.get("incidents") or []
    out = [f"stragglers (live detection, {document.get('intervals_scored', 0)} intervals of "
           f"{document.get('interval_steps')} batches, threshold {document.get('threshold')}x for "
           f"{document.get('patience')} intervals):"]
    for incident in incidents[:most]:
        state = "still slow" if incident.get("open") else f"recovered after interval {incident.get('last_interval')}"
        out.append(f"  {'!' if incident.get('open') else '-'} {incident.get('message')} [since interval "
                   f"{incident.get('first_interval')}, {state}]")
    if len(incidents) > most:
        out.append(f"  ... {len(incidents) - most} more incidents in {STRAGGLERS_FILE}")
    if not incidents:
        out.append("  no straggler incident")
    ranks = document.get("ranks") or []
    if ranks:
        out.append(f"  slowest ranks in interval {document.get('last_interval')} (work over the median of the peers):")
        for row in ranks[:most]:
            part, score = row.get("slow_part", ""), float(row.get("score", 0.0))
            ratio = float(row.get("part_ratios", {}).get(part, 1.0))
            slow = score > float(document.get("threshold") or 1.0)
            detail = f"; most excess in {PART_LABELS.get(part, part)} ({ratio:.2f}x)" if slow else ""
            out.append(f"    rank {row.get('rank')} on {row.get('host')}: {score:.2f}x{detail}")
    return out


def render_file(path: Path) -> str:
    """The table from a ``stragglers.json`` file (one line saying why when it cannot be read)."""
    try:
        return "\n".join(render_lines(_load(path))) + "\n"
    except (DumpReadError, ValueError, AttributeError, TypeError, RecursionError) as err:
        return f"stragglers: {path} is unreadable ({err})\n"


def incident_count(path: Path) -> int:
    """Straggler incidents recorded in a ``stragglers.json`` file (0 when unreadable)."""
    try:
        incidents = _load(path).get("incidents") or []
        return len(incidents) if isinstance(incidents, list) else 0
    except (DumpReadError, ValueError, AttributeError, TypeError, RecursionError):
        return 0
