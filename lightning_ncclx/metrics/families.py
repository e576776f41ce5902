"""Metric families of one or more rank snapshots (the server's one, a host's textfile all of
them), every sample labelled with its rank, local rank and host."""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

from lightning_ncclx.metrics.snapshot import PHASES

LABELS = ["rank", "local_rank", "host"]


def _labels(snap: dict[str, Any]) -> list[str]:
    return [str(snap.get("rank")), str(snap.get("local_rank")), str(snap.get("host"))]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def families(snapshots: Iterable[dict[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    snaps = list(snapshots)
    gauges = {
        "watchdog_up": ("ncclx_watchdog_up", "1 while the rank's stall watchdog thread runs"),
        "seconds_since_heartbeat": ("ncclx_seconds_since_heartbeat", "Seconds since the rank's last heartbeat"),
        "global_step": ("ncclx_global_step", "The Trainer's global step"),
        "step_seconds": ("ncclx_step_seconds", "Duration of the rank's last training batch"),
    }
    for field, (name, text) in gauges.items():
        family = GaugeMetricFamily(name, text, labels=LABELS)
        for snap in snaps:
            value = _number(snap.get(field))
            if value is not None:
                family.add_metric(_labels(snap), value)
        yield family
    phase = GaugeMetricFamily("ncclx_phase", "1 for the phase of the rank's last heartbeat", labels=LABELS + ["phase"])
    for snap in snaps:
        if snap.get("phase") is not None:
            for name in PHASES:
                phase.add_metric(_labels(snap) + [name], 1.0 if snap.get("phase") == name else 0.0)
    yield phase
    dumps = CounterMetricFamily("ncclx_dumps_written", "Dumps this rank wrote", labels=LABELS)
    events = GaugeMetricFamily("ncclx_events", "Events of this rank by reason (stall: not recovered)",
                               labels=LABELS + ["reason"])
    kinds = CounterMetricFamily("ncclx_hang_kinds", "Events this rank summarized, by hang kind",
                                labels=LABELS + ["kind"])
    scores = GaugeMetricFamily("ncclx_straggler_score", "Straggler score of each rank (from the scoring rank)",
                               labels=LABELS + ["scored_rank"])
    for snap in snaps:
        dumps.add_metric(_labels(snap), float(snap.get("dumps_written") or 0))
        for reason, count in dict(snap.get("events") or {}).items():
            events.add_metric(_labels(snap) + [str(reason)], float(count))
        for kind, count in dict(snap.get("hang_kinds") or {}).items():
            kinds.add_metric(_labels(snap) + [str(kind)], float(count))
        for scored, score in dict(snap.get("straggler_scores") or {}).items():
            value = _number(score)
            if value is not None:
                scores.add_metric(_labels(snap) + [str(scored)], value)
    yield from (dumps, events, kinds, scores)


class SnapshotCollector:
    """A prometheus_client collector that reads the snapshots at each scrape."""

    def __init__(self, read: Any) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        yield from families(self.read())
