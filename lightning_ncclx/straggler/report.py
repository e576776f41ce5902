"""``stragglers.json``: what live detection knew, written into the run's dump folder; and the table
``lightning-ncclx summarize`` prints from it.

Format (version 1)::

    {"version": 1, "written_at": "...", "interval_steps": 100, "threshold": 1.2, "patience": 3,
     "world_size": 8, "intervals_scored": 12, "last_interval": 11,
     "ranks": [{"rank", "host", "score", "slow_part", "parts_ms": {...}, "part_ratios": {...}}, ...],
     "incidents": [{"rank", "host", "part", "first_interval", "last_interval", "score_max",
                    "part_ratio", "open", "message"}, ...]}

``ranks`` is the last scored interval, slowest first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning_ncclx.straggler.scoring import PART_LABELS, Incident, IntervalScores

FILE_NAME = "stragglers.json"
FORMAT_VERSION = 1


def build_document(*, scores: IntervalScores | None, incidents: list[Incident], intervals_scored: int,
                   interval_steps: int, threshold: float, patience: int, world_size: int) -> dict[str, Any]:
    ranks = [] if scores is None else [
        {"rank": s.rank, "host": s.host, "score": round(s.score, 4), "slow_part": s.slow_part,
         "parts_ms": {p: round(v * 1e3, 3) for p, v in s.parts.items()},
         "part_ratios": {p: round(v, 4) for p, v in s.part_ratios.items()}}
        for s in scores.ranks]
    return {"version": FORMAT_VERSION, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "interval_steps": interval_steps, "threshold": threshold, "patience": patience, "world_size": world_size,
            "intervals_scored": intervals_scored, "last_interval": None if scores is None else scores.interval,
            "ranks": ranks, "incidents": [i.to_json() for i in incidents]}


def write_document(folder: Path, document: dict[str, Any]) -> Path:
    from lightning_ncclx.dump.writer import atomic_write_text

    return atomic_write_text(Path(folder) / FILE_NAME, json.dumps(document, indent=1) + "\n")


def find_document(path: Path) -> Path | None:
    """``stragglers.json`` in ``path`` (a run's dump folder) or its parent (``path`` is an event folder)."""
    path = Path(path)
    for folder in (path, path.parent) if path.is_dir() else (path.parent,):
        candidate = folder / FILE_NAME
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
        out.append(f"  ... {len(incidents) - most} more incidents in {FILE_NAME}")
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
        return "\n".join(render_lines(json.loads(Path(path).read_text()))) + "\n"
    except (OSError, ValueError, AttributeError) as err:
        return f"stragglers: {path} is unreadable ({err})\n"


def incident_count(path: Path) -> int:
    """Straggler incidents recorded in a ``stragglers.json`` file (0 when unreadable)."""
    try:
        return len(json.loads(Path(path).read_text()).get("incidents") or [])
    except (OSError, ValueError, AttributeError):
        return 0
