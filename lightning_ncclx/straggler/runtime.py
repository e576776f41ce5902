"""The per-rank helper thread of straggler detection.

Every rank's thread turns the main thread's step records of an interval into one
``IntervalSummary`` and writes it to the job's store. The reading rank's thread (global rank 0)
also waits for every rank's summary of an interval, scores it, warns once per episode, writes
``stragglers.json``, sends a straggler warning when ``ncclx.alerts.stragglers`` is on (rate
limited) and hands the metrics back for the Trainer's loggers. The main thread only
puts a list on a queue; the thread never calls a collective, catches and logs its own errors,
and is a daemon joined with a timeout, so it never holds up shutdown.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from lightning_ncclx.alerts import AlertNotifier
from lightning_ncclx.config import AlertsConfig, StragglerConfig
from lightning_ncclx.straggler import exchange
from lightning_ncclx.straggler.scores_file import build_document, write_document
from lightning_ncclx.straggler.scoring import EpisodeTracker, IntervalScores, score_interval
from lightning_ncclx.straggler.timings import StepRecord, summarize_records

log = logging.getLogger(__name__)

FINAL_WAIT_SECONDS = 3.0
"""At stop, how long the reading rank waits for the peers' last interval."""

class StragglerRuntime:
    """Queue, thread and (on the reading rank) scores of one rank during one fit."""

    def __init__(self, config: StragglerConfig, *, rank: int, world_size: int, store: Any, host: str, fit: int,
                 dump_dir: Path | None, alerts: AlertsConfig | None = None) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.store = store
        self.host = host
        self.fit = fit
        self.dump_dir = dump_dir
        self.reader = rank == 0
        self.alerts = (AlertNotifier(alerts, rank=rank) if self.reader and dump_dir is not None and alerts is not None
                       and alerts.enabled and alerts.stragglers and alerts.has_sink else None)
        """Sends the straggler warnings (reading rank only, when ``ncclx.alerts.stragglers`` is on)."""
        self.tracker = EpisodeTracker(config.threshold, config.patience, config.interval_steps)
        self.latest: IntervalScores | None = None
        self.intervals_scored = 0
        self._next_interval = 0
        self._inbox: queue.SimpleQueue[tuple[int, list[StepRecord]]] = queue.SimpleQueue()
        self._metrics: queue.SimpleQueue[tuple[int, dict[str, float]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name=f"ncclx-straggler-rank{rank}", daemon=True)

    # ------------------------------------------------------------------ main thread
    def start(self) -> None:
        self._thread.start()

    def submit(self, interval: int, records: list[StepRecord]) -> None:
        """Hand one interval's records to the thread (never blocks)."""
        self._inbox.put((interval, records))

    def metrics(self) -> list[tuple[int, dict[str, float]]]:
        """Metrics of the intervals scored since the last call (reading rank only)."""
        out = []
        while True:
            try:
                out.append(self._metrics.get_nowait())
            except queue.Empty:
                return out

    def stop(self, timeout_seconds: float = FINAL_WAIT_SECONDS + 2.0) -> None:
        """Publish what is queued, let the reader score the last interval, write stragglers.json."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_seconds)
            if self._thread.is_alive():
                log.warning("[rank %d] straggler thread still busy at shutdown; left behind (daemon)", self.rank)
        if self.alerts is not None:  # at most ncclx.alerts.deadline_seconds, only while a warning is in flight
            self.alerts.drain()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                interval, records = self._inbox.get(timeout=self.config.poll_interval_seconds)
            except queue.Empty:
                interval, records = -1, []
            self._guarded(self._step, interval, records)
        self._guarded(self._finish)

    def _guarded(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
            self._failures = 0
        except Exception:  # noqa: BLE001 - e.g. the store went away at the end of the job
            self._failures += 1
            if self._failures in (1, 10) or self._failures % 100 == 0:
                log.warning("[rank %d] straggler detection: store exchange failed (%d in a row)", self.rank,
                            self._failures, exc_info=True)
            self._stop.wait(min(5.0, self.config.poll_interval_seconds * self._failures))

    def _step(self, interval: int, records: list[StepRecord]) -> None:
        if interval >= 0:
            self._publish(interval, records)
        if self.reader:
            self._collect_ready()

    def _publish(self, interval: int, records: list[StepRecord]) -> None:
        summary = summarize_records(records, rank=self.rank, interval=interval, host=self.host)
        exchange.publish(self.store, self.fit, summary)

    def _finish(self) -> None:
        while True:
            try:
                interval, records = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._publish(interval, records)
        if not self.reader:
            return
        deadline = time.monotonic() + FINAL_WAIT_SECONDS
        while self._collect_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.write_json()

    def _collect_ready(self) -> bool:
        """Score every complete interval in order; True when the next one is partly there."""
        while True:
            arrived = exchange.arrived(self.store, self.fit, self._next_interval, self.world_size)
            if arrived >= self.world_size or (arrived > 0 and exchange.arrived(
                    self.store, self.fit, self._next_interval + 1, self.world_size) >= self.world_size):
                # A later interval complete while this one is not: a rank skipped it; score who came.
                summaries = exchange.collect(self.store, self.fit, self._next_interval, self.world_size)
                self._next_interval += 1
                self._score(summaries)
                continue
            return arrived > 0

    def _score(self, summaries: list) -> None:
        scores = score_interval(summaries)
        if scores is None:
            return
        with self._lock:
            opened, closed = self.tracker.update(scores)
            self.latest = scores
            self.intervals_scored += 1
            open_now = len(self.tracker.open_episodes)
        for episode in opened:
            log.warning("straggler: %s", episode.message)
            if self.alerts is not None and self.dump_dir is not None:
                self.alerts.straggler(self.dump_dir, episode.to_json())
        for episode in closed:
            log.info("straggler: rank %d on %s back within %.2fx of its peers (episode from interval %d to %d)",
                     episode.rank, episode.host, self.config.threshold, episode.first_interval,
                     episode.last_interval)
        slowest = scores.ranks[0]
        self._metrics.put((scores.interval, {"ncclx/straggler/score_max": slowest.score,
                                             "ncclx/straggler/slowest_rank": float(slowest.rank),
                                             "ncclx/straggler/open_episodes": float(open_now)}))
        self.write_json()  # every interval once a rank was slow: after a hard hang the run's folder says who

    # ------------------------------------------------------------------ stragglers.json
    def document(self) -> dict[str, Any]:
        with self._lock:
            return build_document(scores=self.latest, episodes=list(self.tracker.episodes),
                                  intervals_scored=self.intervals_scored, interval_steps=self.config.interval_steps,
                                  threshold=self.config.threshold, patience=self.config.patience,
                                  world_size=self.world_size)

    def write_json(self, folder: Path | None = None) -> Path | None:
        """Write stragglers.json into ``folder`` (an event's folder), or into the run's dump folder
        once there has been an episode: a healthy run leaves no file and no folder. Reading rank only."""
        target = folder if folder is not None else self.dump_dir
        if not self.reader or target is None:
            return None
        if folder is None:
            with self._lock:
                if not self.tracker.episodes:
                    return None
        try:
            return write_document(target, self.document())
        except OSError:
            log.warning("[rank %d] writing %s/stragglers.json failed", self.rank, target, exc_info=True)
            return None
