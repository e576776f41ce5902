"""Fast hang detection by peer consensus: the ranks say where they wait; rank 0 decides.

One rank's clock cannot tell a hang from a slow healthy step, so the step threshold has a 30 s
floor. The ranks together can: in a hang, most of them sit in a collective and the others are
busy elsewhere, and that picture does not change. A slow healthy step either ends (the ranks'
heartbeats move on and their reports are withdrawn) or is in a phase that explains it.

Each rank (watchdog thread, nothing on the training path):
- while its training step has run longer than ``wait`` (see :meth:`Heartbeat.consensus_wait`)
  and it is not compiling or saving a checkpoint, keeps one report in the store: blocked in
  which collectives (from :mod:`collective_probe`), or busy outside any; posted once, changed
  only when it changes, withdrawn at the next heartbeat;
- never reports in another phase (validation, checkpoint, epoch start, first step, teardown):
  a rank that has not reported vetoes the decision, so those phases can never look like a hang;
- a rank outside any collective whose main thread kept a CPU busy over the last poll says it is
  *working*, which vetoes too: rank-0-only work in a hook (an evaluation, a logger's upload) while
  the others wait at a barrier is slow, not stuck. A stuck rank waits: sleeps, blocks on a lock,
  a queue, a data loader, a dead peer. (One spinning in a GPU sync or a Python loop is left to
  the step threshold.)

Rank 0 reads one counter per poll and, once every rank has reported, all reports in one request.
It declares a hang when at least ``quorum`` of the ranks are blocked and the reports are the same
at two polls in a row. In steady state nothing is written, and only rank 0 reads (one key).

Store keys (under the ``lightning_ncclx/`` prefix, next to the event keys of ``coordinator``):
``cs/rank/<r>`` (the report's JSON, empty when none; deleted when the watchdog stops),
``cs/posted`` (how many ranks have a report), ``cs/changes`` (bumped by every post and withdrawal).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from lightning_ncclx.config import ConsensusConfig
from lightning_ncclx.watchdog.activity import main_thread_phase as read_main_thread_phase
from lightning_ncclx.watchdog.collective_probe import BlockedIn, blocked_collectives
from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase

log = logging.getLogger(__name__)

POSTED_KEY = "cs/posted"
CHANGES_KEY = "cs/changes"
MAX_REPORT_BYTES = 64 * 1024
MAX_BLOCKED_LISTED = 16
WORKING_CPU_SHARE = 0.25
"""A main thread that used at least this share of a CPU over the last poll is working."""


def report_key(rank: int) -> str:
    return f"cs/rank/{rank}"


@dataclass(frozen=True)
class RankReport:
    """What one rank says while its step has overrun ``wait``."""

    rank: int
    beat: int
    """The heartbeat this report belongs to (a new heartbeat withdraws it)."""
    step: int
    blocked: tuple[BlockedIn, ...]
    """Empty: busy outside any collective (compute, data loader, host code)."""
    waited_seconds: float
    """Since the heartbeat, when posted (not compared: a report is not re-posted as time passes)."""
    working: bool = False
    """Outside any collective with its main thread busy on a CPU (see ``WORKING_CPU_SHARE``)."""

    def same_as(self, other: "RankReport | None") -> bool:
        return other is not None and (self.rank, self.beat, self.blocked, self.working) == (
            other.rank, other.beat, other.blocked, other.working)

    def to_json(self) -> str:
        return json.dumps({"rank": self.rank, "beat": self.beat, "step": self.step,
                           "blocked": [[b.backend, b.pg_id, b.op_id] for b in self.blocked[:MAX_BLOCKED_LISTED]],
                           "waited": round(self.waited_seconds, 3), "working": self.working})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "RankReport | None":
        """None for an empty or malformed value (another writer's bytes are not trusted)."""
        if not raw or len(raw) > MAX_REPORT_BYTES:
            return None
        try:
            data = json.loads(raw)
            blocked = tuple(BlockedIn(str(b[0]), str(b[1]), int(b[2])) for b in data["blocked"][:MAX_BLOCKED_LISTED])
            waited = float(data["waited"])
            working = data.get("working", False)
            return cls(rank=int(data["rank"]), beat=int(data["beat"]), step=int(data["step"]), blocked=blocked,
                       waited_seconds=waited if math.isfinite(waited) else 0.0, working=working is True)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None


@dataclass(frozen=True)
class Picture:
    """Every rank's report as rank 0 read them."""

    world_size: int
    reports: dict[int, RankReport]

    @property
    def blocked(self) -> dict[int, tuple[BlockedIn, ...]]:
        return {r: rep.blocked for r, rep in sorted(self.reports.items()) if rep.blocked}

    @property
    def busy(self) -> list[int]:
        return sorted(r for r, rep in self.reports.items() if not rep.blocked)

    @property
    def working(self) -> list[int]:
        return sorted(r for r, rep in self.reports.items() if rep.working and not rep.blocked)

    @property
    def silent(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.reports]

    def is_hang(self, quorum: float) -> bool:
        """Every rank reported (a rank in a phase that explains a long wait never does), none is
        working, and at least ``quorum`` of them wait in a collective."""
        if self.silent or self.working or self.world_size < 1:
            return False
        return len(self.blocked) >= max(1, math.ceil(quorum * self.world_size - 1e-9))

    def describe(self) -> str:
        groups: dict[tuple[BlockedIn, ...], list[int]] = {}
        for r, blocked in self.blocked.items():
            groups.setdefault(blocked, []).append(r)
        parts = [f"rank(s) {_ranks(rs)} blocked in {', '.join(b.label() for b in where)}"
                 for where, rs in sorted(groups.items(), key=lambda item: item[1][0])]
        idle = [r for r in self.busy if r not in self.working]
        if idle:
            waited = max(self.reports[r].waited_seconds for r in idle)
            parts.append(f"rank(s) {_ranks(idle)} outside any collective, waiting (step overran by {waited:.1f} s+)")
        if self.working:
            parts.append(f"rank(s) {_ranks(self.working)} outside any collective, working")
        return "; ".join(parts)


def _ranks(ranks: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


class ConsensusBoard:
    """The store side: one rank's report, and rank 0's reading of all of them."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.posted: RankReport | None = None
        self.posts = 0

    def start(self) -> None:
        """An empty report, so that rank 0 can read every rank's key in one request."""
        self.store.set(report_key(self.rank), "")

    def post(self, report: RankReport) -> None:
        self.store.set(report_key(self.rank), report.to_json())
        if self.posted is None:
            self.store.add(POSTED_KEY, 1)
        self.store.add(CHANGES_KEY, 1)
        self.posted = report
        self.posts += 1

    def withdraw(self) -> None:
        if self.posted is None:
            return
        self.store.set(report_key(self.rank), "")
        self.posted = None
        self.store.add(POSTED_KEY, -1)
        self.store.add(CHANGES_KEY, 1)

    def stop(self) -> None:
        self.withdraw()
        self.store.delete_key(report_key(self.rank))

    def counters(self) -> tuple[int, int]:
        """(ranks with a report, changes so far): two small requests."""
        return int(self.store.add(POSTED_KEY, 0)), int(self.store.add(CHANGES_KEY, 0))

    def read_all(self) -> dict[int, RankReport] | None:
        """Every rank's report (one request); None while some rank's key does not exist (its
        watchdog has not started, or has stopped)."""
        keys = [report_key(r) for r in range(self.world_size)]
        if not self.store.check(keys):
            return None
        reports: dict[int, RankReport] = {}
        for rank, raw in enumerate(self.store.multi_get(keys)):
            report = RankReport.from_json(raw)
            if report is not None and report.rank == rank:
                reports[rank] = report
        return reports


class Consensus:
    """One rank's part, called once per watchdog poll; on rank 0 it also decides."""

    def __init__(self, config: ConsensusConfig, board: ConsensusBoard, heartbeat: Heartbeat, *,
                 poll_interval_seconds: float,
                 probe: Callable[[], list[BlockedIn]] = blocked_collectives,
                 main_thread_phase: Callable[[], Phase | None] | None = None,
                 main_thread_cpu: Callable[[], float | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.board = board
        self.heartbeat = heartbeat
        self.poll_interval_seconds = poll_interval_seconds
        self._probe = probe
        self._main_thread_phase = main_thread_phase or read_main_thread_phase
        self._main_thread_cpu = main_thread_cpu or read_main_thread_cpu
        self._cpu_sample: tuple[float, float] | None = None
        self._clock = clock
        self._pending: tuple[int, float] | None = None
        """(changes counter, time) of a hang picture waiting for its confirming poll."""
        self._fired_changes: int | None = None
        self._unfinished_at_start: frozenset[BlockedIn] = frozenset()
        """Ops already unfinished when this watchdog started: a destroyed group's leftovers (the
        recorder keeps the status of groups of an earlier Trainer in this process), never this
        run's wait."""
        self.probes = 0

    @property
    def evaluates(self) -> bool:
        return self.board.rank == 0

    def start(self) -> None:
        self._unfinished_at_start = frozenset(self._probe())
        self.board.start()

    def stop(self) -> None:
        self.board.stop()

    def tick(self) -> Picture | None:
        """Update this rank's report; on rank 0, the picture once it is a confirmed hang."""
        self._update_report()
        return self._decide() if self.evaluates else None

    def _main_thread_working(self) -> bool:
        """True when the main thread used ``WORKING_CPU_SHARE`` of a CPU since the last poll
        (sampled at every poll, so the first report already knows)."""
        now, cpu = self._clock(), self._main_thread_cpu()
        previous, self._cpu_sample = self._cpu_sample, (now, cpu) if cpu is not None else None
        if previous is None or cpu is None or now <= previous[0]:
            return False
        return (cpu - previous[1]) / (now - previous[0]) >= WORKING_CPU_SHARE

    def _update_report(self) -> None:
        working = self._main_thread_working()
        beat = self.heartbeat.last
        wait = self.heartbeat.consensus_wait()
        waited = self._clock() - beat.time
        posted = self.board.posted
        if posted is not None and posted.beat != beat.seq:
            self.board.withdraw()
            posted = None
        if wait is None or beat.phase is not Phase.train_step or waited <= wait:
            if posted is not None:
                self.board.withdraw()
            return
        if self._main_thread_phase() is not None:  # compiling or saving: a long step is expected
            if posted is not None:
                self.board.withdraw()
            return
        self.probes += 1
        blocked = tuple(b for b in self._probe() if b not in self._unfinished_at_start)
        report = RankReport(rank=self.board.rank, beat=beat.seq, step=beat.step, blocked=blocked,
                            waited_seconds=waited, working=working and not blocked)
        if not report.same_as(posted):
            self.board.post(report)

    def _decide(self) -> Picture | None:
        posted, changes = self.board.counters()
        if posted < self.board.world_size or changes == self._fired_changes:
            self._pending = None
            return None
        now = self._clock()
        if self._pending is not None and self._pending[0] == changes:
            if now - self._pending[1] < self.poll_interval_seconds * 0.9:
                return None
            reports = self.board.read_all()
            if reports is None:
                return None
            picture = Picture(self.board.world_size, reports)
            _, changes_after = self.board.counters()
            if changes_after != changes or not picture.is_hang(self.config.quorum):
                self._pending = None
                return None
            self._fired_changes = changes
            self._pending = None
            return picture
        reports = self.board.read_all()
        if reports is not None and Picture(self.board.world_size, reports).is_hang(self.config.quorum):
            self._pending = (changes, now)
        else:
            self._pending = None
        return None


def read_main_thread_cpu() -> float | None:
    """CPU seconds the main thread has used (Linux ``/proc``); None where that cannot be read."""
    tid = threading.main_thread().native_id
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


try:
    _CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    _CLOCK_TICKS = 100.0
