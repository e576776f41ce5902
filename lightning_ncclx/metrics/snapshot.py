"""One rank's metrics as a plain dict, read at scrape time from the running parts (no work in
the training step beyond two clock reads)."""

from __future__ import annotations

import socket
from typing import Any

PHASES = ("setup", "first_step", "train_step", "epoch_start", "validation", "checkpoint", "teardown", "idle")


def rank_snapshot(*, rank: int, local_rank: int, watchdog: Any, straggler: Any, global_step: int | None,
                  step_seconds: float | None) -> dict[str, Any]:
    """``watchdog``: the rank's ``WatchdogRuntime`` or None; ``straggler``: its ``StragglerRuntime`` or None."""
    snap: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "host": socket.gethostname(),
                            "watchdog_up": 0, "global_step": global_step, "step_seconds": step_seconds,
                            "seconds_since_heartbeat": None, "phase": None, "events": {}, "dumps_written": 0,
                            "hang_kinds": {}, "straggler_scores": {}}
    if watchdog is not None:
        progress = watchdog.heartbeat.progress()
        snap["watchdog_up"] = int(bool(watchdog.running))
        snap["seconds_since_heartbeat"] = progress.get("seconds_since_heartbeat")
        snap["phase"] = progress.get("phase")
        snap["events"] = {"stall": int(watchdog.stall_events), "on_demand": int(watchdog.on_demand_events),
                          "recovered": int(getattr(watchdog.participation, "recovered_events", 0))}
        snap["dumps_written"] = int(watchdog.events_taken_part)
        kinds: dict[str, int] = {}
        for result in list(watchdog.results):
            kind = getattr(result, "hang_kind", None)
            if kind:
                kinds[str(kind)] = kinds.get(str(kind), 0) + 1
        snap["hang_kinds"] = kinds
    latest = getattr(straggler, "latest", None) if straggler is not None else None
    if latest is not None:
        snap["straggler_scores"] = {str(score.rank): float(score.score) for score in latest.ranks}
    return snap
