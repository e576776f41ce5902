"""``stragglers.json``: what live detection knew, written into the run's dump folder (the table
``lightning-ncclx summarize`` prints from it is :mod:`lightning_ncclx.report.stragglers`).

Format (version 2; version 1 called ``episodes`` ``incidents``)::

    {"version": 2, "written_at": "...", "interval_steps": 100, "threshold": 1.2, "patience": 3,
     "world_size": 8, "intervals_scored": 12, "last_interval": 11,
     "ranks": [{"rank", "host", "score", "slow_part", "parts_ms": {...}, "part_ratios": {...}}, ...],
     "episodes": [{"rank", "host", "part", "first_interval", "last_interval", "score_max",
                   "part_ratio", "opened_interval", "open", "message"}, ...]}

``ranks`` is the last scored interval, slowest first; an episode is one rank slow for a run of
intervals.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning_ncclx.files import atomic_write_text
from lightning_ncclx.layout import STRAGGLERS_FILE
from lightning_ncclx.report.stragglers import FORMAT_VERSION
from lightning_ncclx.straggler.scoring import IntervalScores, StragglerEpisode


def build_document(*, scores: IntervalScores | None, episodes: list[StragglerEpisode], intervals_scored: int,
                   interval_steps: int, threshold: float, patience: int, world_size: int) -> dict[str, Any]:
    ranks = [] if scores is None else [
        {"rank": s.rank, "host": s.host, "score": round(s.score, 4), "slow_part": s.slow_part,
         "parts_ms": {p: round(v * 1e3, 3) for p, v in s.parts.items()},
         "part_ratios": {p: round(v, 4) for p, v in s.part_ratios.items()}}
        for s in scores.ranks]
    return {"version": FORMAT_VERSION, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "interval_steps": interval_steps, "threshold": threshold, "patience": patience, "world_size": world_size,
            "intervals_scored": intervals_scored, "last_interval": None if scores is None else scores.interval,
            "ranks": ranks, "episodes": [e.to_json() for e in episodes]}


def write_document(folder: Path, document: dict[str, Any]) -> Path:
    return atomic_write_text(Path(folder) / STRAGGLERS_FILE, json.dumps(document, indent=1) + "\n")
