"""Heartbeats and stall thresholds: pure logic on an injectable clock, no threads, no torch.

The main thread writes a heartbeat at every batch boundary (one tuple assignment: atomic in
CPython, no lock on the training path); the watchdog thread reads it and asks whether the time
since the last heartbeat has passed the threshold of the phase the rank is in.

Example::

    hb = Heartbeat(WatchdogConfig(train_step_seconds=60.0), clock=fake_clock)
    hb.train_batch_start(global_step=0)
    stall = hb.check()          # None, or a Stall once 60 s pass without a heartbeat
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from lightning_ncclx.config import WatchdogConfig

LONGEST_KEPT = 16


class Phase(str, Enum):
    """What the rank was doing at its last heartbeat; each phase has its own threshold."""

    setup = "setup"
    """Between ``setup`` and the first training batch (DDP wrapping, sanity check, loaders)."""
    first_step = "first_step"
    """The first training batch of this process (compilation, lazy communicator set-up)."""
    train_step = "train_step"
    epoch_start = "epoch_start"
    """From a later training epoch's start to its first batch: the loader's workers restart and
    its first batch is fetched then, which can take far longer than a step."""
    validation = "validation"
    """From an evaluation loop's start (its loader's set-up, every ``on_validation_*`` hook) or a
    training epoch's end (every ``on_train_epoch_end``, epoch-end syncs) until the next training
    batch or epoch starts; also test and predict. Set at the loop level (:mod:`loop_phases`)."""
    checkpoint = "checkpoint"
    """From ``Trainer.save_checkpoint``'s start (state dicts built, FSDP gathers, the write, the
    closing barrier) to its end, however it was called."""
    teardown = "teardown"
    """After the last batch of fit, validate, test or predict: strategy teardown, ``on_fit_end``,
    until the watchdog stops."""
    idle = "idle"
    """After an exception, while the watchdog stops: never a stall."""


@dataclass(frozen=True)
class Beat:
    phase: Phase
    time: float
    step: int
    """Training batches completed in this process (counts batches, not optimizer steps)."""
    global_step: int | None
    seq: int


@dataclass(frozen=True)
class Stall:
    phase: Phase
    step: int
    global_step: int | None
    seconds_since_heartbeat: float
    threshold_seconds: float
    seq: int


class Heartbeat:
    """The last heartbeat of one rank plus the step-time history behind the ``auto`` threshold."""

    def __init__(self, config: WatchdogConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._seq = 0
        self._batches = 0
        self._in_sanity_check = False
        self._step_times: deque[tuple[int, float]] = deque(maxlen=max(1, config.auto.window))
        """(the seq its measure started at, seconds) of the recent steps."""
        self._steps_observed = 0
        self._longest_step = 0.0
        self._longest: list[tuple[float, int]] = []
        """The ``LONGEST_KEPT`` longest steps as (seconds, start seq), so one can be forgotten."""
        self._step_start_seq = 0
        self._stalled_seqs: set[int] = set()
        """Heartbeats that a stall event was about and that recovered: the step around each is a
        wait the event reported, not a step time (set by the watchdog thread)."""
        self._batch_start_time: float | None = None
        self._last_batch_end_time: float | None = None
        self._reported_seq = -1
        self._beat = Beat(Phase.setup, clock(), 0, None, 0)

    # ------------------------------------------------------------------ written by the main thread
    def beat(self, phase: Phase, global_step: int | None = None) -> None:
        self._seq += 1
        if phase is not Phase.train_step:
            self._last_batch_end_time = None  # a step time must not include validation or saving
        self._beat = Beat(phase, self._clock(), self._batches, global_step, self._seq)

    def train_batch_start(self, global_step: int | None = None) -> None:
        phase = Phase.first_step if self._batches == 0 else Phase.train_step
        now = self._clock()
        if self._last_batch_end_time is None:
            self._step_start_seq = self._seq + 1
        self._batch_start_time = now
        self._seq += 1
        self._beat = Beat(phase, now, self._batches, global_step, self._seq)

    def train_batch_end(self, global_step: int | None = None) -> None:
        now = self._clock()
        if self._batches > 0:  # the first batch (compilation) says nothing about later steps
            start = self._last_batch_end_time if self._last_batch_end_time is not None else self._batch_start_time
            if start is not None:
                self._record_step(max(0.0, now - start))
        self._batches += 1
        self._last_batch_end_time = now
        self._batch_start_time = None
        self._seq += 1
        self._step_start_seq = self._seq
        self._beat = Beat(Phase.train_step, now, self._batches, global_step, self._seq)

    def _record_step(self, seconds: float) -> None:
        """Main thread. A step that held a recovered stall's heartbeat is no step time."""
        stalled = self._stalled_seqs
        if stalled:
            if any(self._step_start_seq <= seq <= self._seq for seq in tuple(stalled)):
                return
            self._drop_stalled(tuple(stalled))
        self._step_times.append((self._step_start_seq, seconds))
        self._steps_observed += 1
        if len(self._longest) < LONGEST_KEPT or seconds > self._longest[-1][0]:
            self._longest = sorted(self._longest + [(seconds, self._step_start_seq)], reverse=True)[:LONGEST_KEPT]
            self._longest_step = self._longest[0][0]

    def _drop_stalled(self, seqs: tuple[int, ...]) -> None:
        """Forget the steps already recorded around heartbeats that were recovered stalls."""
        def held(start: int, end: int) -> bool:
            return any(start <= seq <= end for seq in seqs)

        steps = list(self._step_times)
        kept = [(start, t) for i, (start, t) in enumerate(steps)
                if not held(start, steps[i + 1][0] if i + 1 < len(steps) else self._seq)]
        if len(kept) != len(steps):
            self._step_times = deque(kept, maxlen=self._step_times.maxlen)
        ends = {start: (steps[i + 1][0] if i + 1 < len(steps) else self._seq) for i, (start, _) in enumerate(steps)}
        self._longest = [(t, start) for t, start in self._longest if not held(start, ends.get(start, start))]
        self._longest_step = self._longest[0][0] if self._longest else 0.0
        self._stalled_seqs = set()

    def forget_stall(self, beat_seq: int) -> None:
        """Watchdog thread, when a stall about heartbeat ``beat_seq`` recovered: that wait is not
        a step time (else one recovered 12 s wait raises every threshold learned from steps for
        the rest of the run; the consensus learns the wait per site instead). Applied by the main
        thread at its next step end, so the training path takes no lock."""
        self._stalled_seqs = self._stalled_seqs | {beat_seq}

    def sanity_check(self, running: bool) -> None:
        self._in_sanity_check = running
        self.beat(Phase.validation if running else Phase.setup)

    # ------------------------------------------------------------------ read by the watchdog thread
    @property
    def last(self) -> Beat:
        return self._beat

    @property
    def batches(self) -> int:
        return self._batches

    def auto_threshold(self) -> float | None:
        """The learned training-step threshold, or None before the warm-up is over."""
        auto = self.config.auto
        if not auto.enabled or self._steps_observed < max(1, auto.warmup_steps) or not self._step_times:
            return None
        learned = auto.multiplier * max(t for _, t in tuple(self._step_times))
        return min(self.config.train_step_seconds, max(auto.floor_seconds, learned))

    def overrun_bar(self) -> float:
        """How long a step must have run to be plain evidence that this rank is stuck: the
        consensus rule (``multiplier`` x the slowest step, at least ``min_wait_seconds``), whether
        or not the consensus is on or warmed up, never above the step threshold."""
        consensus = self.config.consensus
        bar = max(consensus.min_wait_seconds, consensus.multiplier * self._longest_step)
        return min(bar, self.threshold(Phase.train_step))

    def consensus_wait(self) -> float | None:
        """How long a training step may run before this rank reports where it waits (see
        :mod:`consensus`); None before the consensus warm-up is over or with consensus off.

        The slowest step since the start, not of a recent window: a rare slow step (a periodic
        rank-0-only job inside a step) keeps the wait long for the rest of the run."""
        consensus = self.config.consensus
        if not consensus.enabled or self._steps_observed < max(1, consensus.warmup_steps):
            return None
        return max(consensus.min_wait_seconds, consensus.multiplier * self._longest_step)

    def threshold(self, phase: Phase) -> float:
        cfg = self.config
        warming_up = self._batches == 0
        if phase is Phase.idle:
            return math.inf
        if phase in (Phase.setup, Phase.first_step):
            return cfg.first_step_seconds
        if phase in (Phase.validation, Phase.epoch_start):
            return max(cfg.validation_seconds, cfg.first_step_seconds) if warming_up else cfg.validation_seconds
        if phase is Phase.checkpoint:
            return cfg.checkpoint_seconds
        if phase is Phase.teardown:
            return cfg.validation_seconds if cfg.teardown_seconds is None else cfg.teardown_seconds
        learned = self.auto_threshold()
        return cfg.train_step_seconds if learned is None else learned

    def progress(self) -> dict:
        """The fields of context.json the watchdog knows about."""
        beat = self._beat
        threshold = self.threshold(beat.phase)
        return {
            "phase": beat.phase.value,
            "step": beat.step,
            "global_step": beat.global_step,
            "seconds_since_heartbeat": round(max(0.0, self._clock() - beat.time), 3),
            "stall_threshold_seconds": threshold if math.isfinite(threshold) else None,
        }

    def check(self) -> Stall | None:
        """A stall when the last heartbeat is older than its phase's threshold and has not been
        reported yet (one report per heartbeat: a rank stuck for an hour alarms once)."""
        beat = self._beat
        if beat.seq == self._reported_seq:
            return None
        threshold = self.threshold(beat.phase)
        elapsed = self._clock() - beat.time
        if elapsed <= threshold:
            return None
        return Stall(beat.phase, beat.step, beat.global_step, elapsed, threshold, beat.seq)

    def mark_reported(self, seq: int | None = None) -> None:
        """No further alarm until the next heartbeat."""
        self._reported_seq = self._beat.seq if seq is None else seq
