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

FORMAT_VERSION = 2
EPISODES_KEY = {1: "incidents", 2: "episodes"}
"""Where each version of the file keeps its straggler episodes (version 1 named them incidents)."""
MAX_BYTES = 16 << 20
PART_LABELS = {"data_fetch": "data fetch", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}


def _load(path: Path) -> dict[str, Any]:
    data = json.loads(read_regular(path, MAX_BYTES, STRAGGLERS_FILE))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _episodes(document: dict[str, Any]) -> Any:
    return document.get(EPISODES_KEY.get(document.get("version"), "episodes")) or []


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
    if document.get("version") not in EPISODES_KEY:
        return []
    episodes = _episodes(document)
    out = [f"stragglers (live detection, {document.get('intervals_scored', 0)} intervals of "
           f"{document.get('interval_steps')} batches, threshold {document.get('threshold')}x for "
           f"{document.get('patience')} intervals):"]
    for episode in episodes[:most]:
        state = "still slow" if episode.get("open") else f"recovered after interval {episode.get('last_interval')}"
        out.append(f"  {'!' if episode.get('open') else '-'} {episode.get('message')} [since interval "
                   f"{episode.get('first_interval')}, {state}]")
    if len(episodes) > most:
        out.append(f"  ... {len(episodes) - most} more episodes in {STRAGGLERS_FILE}")
    if not episodes:
        out.append("  no straggler episode")
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


def episode_count(path: Path) -> int:
    """Straggler episodes recorded in a ``stragglers.json`` file (0 when unreadable)."""
    try:
        episodes = _episodes(_load(path))
        return len(episodes) if isinstance(episodes, list) else 0
    except (DumpReadError, ValueError, AttributeError, TypeError, RecursionError):
        return 0
