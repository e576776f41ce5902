"""Per-step timings of one rank's own work, recorded at Lightning's hook points.

The main thread only takes ``time.monotonic()`` readings (and, on CUDA, records events); turning
them into seconds and medians happens on the helper thread, once per interval. Parts:

``data_fetch``  previous batch end -> this batch start (the loader's ``next``; CPU clock)
``forward``     batch start -> before backward (``training_step``, zero_grad)
``backward``    before -> after backward; under DDP this includes waiting for the gradient
                all-reduce, so it is reported but never scored
``optimizer``   before the optimizer step -> batch end
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

PARTS = ("data_fetch", "forward", "backward", "optimizer")
SCORED_PARTS = ("data_fetch", "forward", "optimizer")
"""A rank's own work. Backward is left out: under DDP it holds the wait for the slowest peer."""


@dataclass(frozen=True)
class IntervalSummary:
    """What one rank publishes per interval: the median of each part over the interval's batches."""

    rank: int
    interval: int
    host: str
    batches: int
    parts: dict[str, float]

    @property
    def work_seconds(self) -> float:
        return sum(self.parts.get(p, 0.0) for p in SCORED_PARTS)

    def to_compact(self) -> dict[str, Any]:
        return {"r": self.rank, "i": self.interval, "h": self.host, "n": self.batches,
                "p": {k: round(v, 7) for k, v in self.parts.items()}}

    @classmethod
    def from_compact(cls, data: dict[str, Any]) -> "IntervalSummary":
        return cls(rank=int(data["r"]), interval=int(data["i"]), host=str(data["h"]), batches=int(data["n"]),
                   parts={str(k): float(v) for k, v in dict(data["p"]).items()})


@dataclass
class StepRecord:
    """The readings of one batch: CPU times, and CUDA events when timing on the GPU."""

    data_fetch: float | None
    marks: dict[str, float] = field(default_factory=dict)
    events: dict[str, Any] = field(default_factory=dict)

    def seconds(self) -> dict[str, float]:
        """Seconds per part (waits for this step's CUDA events: call on the helper thread)."""
        source: dict[str, Any] = self.events if self.events else self.marks
        elapsed: Callable[[Any, Any], float] = _event_seconds if self.events else (lambda a, b: b - a)
        out: dict[str, float] = {}
        if self.data_fetch is not None:
            out["data_fetch"] = self.data_fetch
        start, end = source.get("start"), source.get("end")
        if start is None or end is None:
            return out
        before_bwd, after_bwd = source.get("before_backward"), source.get("after_backward")
        before_opt = source.get("before_optimizer")
        out["forward"] = elapsed(start, before_bwd if before_bwd is not None else end)
        if before_bwd is not None and after_bwd is not None:
            out["backward"] = elapsed(before_bwd, after_bwd)
        if before_opt is not None:
            out["optimizer"] = elapsed(before_opt, end)
        return out


def _event_seconds(start: Any, end: Any) -> float:
    end.synchronize()  # helper thread only: the training step never waits for this
    return float(start.elapsed_time(end)) / 1e3


class StepRecorder:
    """Main-thread side: collects one ``StepRecord`` per training batch.

    ``use_cuda_events`` records a ``torch.cuda.Event`` at each mark instead of reading the clock
    (data fetch stays on the CPU clock: the loader runs on the host)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, use_cuda_events: bool = False) -> None:
        self._clock = clock
        self._cuda = use_cuda_events
        self._last_end: float | None = None
        self._current: StepRecord | None = None
        self.records: list[StepRecord] = []

    def forget_fetch(self) -> None:
        """The next batch start does not follow a plain loader fetch (epoch start, validation,
        checkpoint): do not count that gap as data fetch."""
        self._last_end = None

    def batch_start(self) -> None:
        now = self._clock()
        fetch = now - self._last_end if self._last_end is not None else None
        self._current = StepRecord(data_fetch=fetch)
        self._mark("start", now)

    def mark(self, name: str) -> None:
        if self._current is not None and name not in self._current.marks:
            self._mark(name, self._clock())

    def batch_end(self) -> None:
        record = self._current
        if record is None:
            return
        now = self._clock()
        self._mark("end", now)
        self.records.append(record)
        self._current = None
        self._last_end = now

    def take(self) -> list[StepRecord]:
        records, self.records = self.records, []
        return records

    def _mark(self, name: str, now: float) -> None:
        assert self._current is not None
        self._current.marks[name] = now
        if self._cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._current.events[name] = event


def summarize_records(records: list[StepRecord], *, rank: int, interval: int, host: str) -> IntervalSummary:
    """Median per part over the interval's batches (robust to one slow batch: a GC, a log flush)."""
    per_part: dict[str, list[float]] = {p: [] for p in PARTS}
    for record in records:
        for part, seconds in record.seconds().items():
            per_part[part].append(seconds)
    parts = {p: statistics.median(v) for p, v in per_part.items() if v}
    return IntervalSummary(rank=rank, interval=interval, host=host, batches=len(records), parts=parts)
