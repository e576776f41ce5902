"""Fast hang detection by peer consensus: the ranks say where they wait; rank 0 decides.

One rank's clock cannot tell a hang from a slow healthy step, so the step threshold has a 30 s
floor. The ranks together can: in a hang, most of them sit in a collective or a point-to-point op
and the others are busy elsewhere, and that picture does not change. A slow healthy step either
ends (the ranks' heartbeats move on and their notices are withdrawn) or is in a phase that
explains it.

Each rank (watchdog thread, nothing on the training path):
- while its training step has run longer than ``wait`` (see :meth:`Heartbeat.consensus_wait`)
  and it is not compiling or saving a checkpoint, keeps one :class:`OverrunNotice` in the store:
  blocked in which collectives and point-to-point ops (from :mod:`collective_probe`), or busy
  outside any; posted once, changed only when it changes, withdrawn at the next heartbeat;
- never posts in another phase (validation, checkpoint, epoch start, first step, teardown):
  a rank that has not posted vetoes the decision, so those phases can never look like a hang;
- a rank outside any collective whose main thread kept a CPU busy over the last poll (on it, or
  preempted and waiting in the run queue on an oversubscribed host) says it is *working*, which vetoes too: rank-0-only work in a hook (an evaluation, a logger's upload) while
  the others wait at a barrier is slow, not stuck. A stuck rank waits: sleeps, blocks on a lock,
  a queue, a data loader, a dead peer. (One spinning in a GPU sync or a Python loop is left to
  the step threshold.)
- a wait that recovered teaches: after an event that ended by itself, :meth:`Consensus.learn_recovery`
  raises this rank's wait while its main thread is at the same *site* (the Lightning hook it
  runs and its innermost frame of user code, :meth:`Consensus.site_now`) to at least
  ``RECOVERY_WAIT_FACTOR`` x how long that wait lasted, for the rest of the run: a job that
  uploads for 12 s every epoch is dumped once, not every epoch. The step threshold still applies.

Rank 0 reads the change log per poll and, once every rank has posted, all notices in one request.
It declares a hang when at least ``quorum`` of the ranks are blocked and the notices are the same
at two polls in a row. In steady state nothing is written, and only rank 0 reads (one key).

A rank whose watchdog cannot run (its main thread holds the GIL in native code, its process is
stopped) posts nothing, and a rank without a notice vetoes. So once a quorum of the ranks is
blocked and the others are silent, rank 0 *pings* the silent ones (``cs/ping``, their doorbells
ring): a watchdog that runs answers within a poll (``cs/answer/<r>``), whatever its phase, and
its silence stays a veto. Ranks that have not answered for ``SILENCE_SECONDS`` count as
evidence like a notice (:attr:`Picture.unanswered`): the picture is confirmed when no notice
changed since the ping (the silence spans several polls), else at the next poll as every picture
is. Rank 0 cannot ping itself: while its own notice is up, rank 1 (the deputy) decides the same
way, and starts the event only when rank 0 is the silent rank.

Store keys (under the ``lightning_ncclx/`` prefix, next to the event keys of ``coordinator``):
``cs/rank/<r>`` (the notice's JSON, empty when none; deleted when the watchdog stops),
``cs/changes`` (a log every post and withdrawal appends one byte to: how many ranks have a
notice and how many changes so far, see :data:`consensus_board.CHANGES_KEY`),
``cs/ping`` (rank 0's latest ping number), ``cs/answer/<r>`` (the latest ping rank r answered).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from lightning_ncclx.config import ConsensusConfig
from lightning_ncclx.dump.p2p_ops import P2PInFlight
from lightning_ncclx.watchdog.activity import main_thread_phase as read_main_thread_phase
from lightning_ncclx.watchdog.activity import main_thread_site as read_main_thread_site
from lightning_ncclx.watchdog.collective_probe import BlockedIn, blocked_collectives, p2p_waits
from lightning_ncclx.watchdog.consensus_board import (  # noqa: F401 - the protocol's names, re-exported
    CHANGES_KEY, ConsensusBoard, OverrunNotice, P2PWait, Picture, notice_key,
)
from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase

log = logging.getLogger(__name__)

WORKING_CPU_SHARE = 0.25
"""A main thread that used (or waited in the run queue for) at least this share of a CPU over the
last poll is working."""
RECOVERY_WAIT_FACTOR = 2.0
"""After a wait at a site recovered by itself, this rank's wait there is at least this many times
as long as that wait lasted, for the rest of the run."""
MAX_LEARNED_SITES = 64
SILENCE_SECONDS = 2.0
"""A rank without a notice that has not answered a ping for this long (or 4 polls, whichever is
longer) while a quorum of the others is blocked cannot run its watchdog: evidence, not a veto."""
MAX_PINGED_RANKS = 64
DEPUTY_RANK = 1
"""Decides in rank 0's place when rank 0 itself is the rank whose watchdog cannot run."""
"""More silent ranks than this are no rank that stopped: they veto as before (no ping)."""


@dataclass(frozen=True)
class _Ping:
    number: int
    sent: float
    ranks: tuple[int, ...]
    changes: int
    """The notices' change counter when it was sent."""


class Consensus:
    """One rank's part, called once per watchdog poll; on rank 0 it also decides."""

    def __init__(self, config: ConsensusConfig, board: ConsensusBoard, heartbeat: Heartbeat, *,
                 poll_interval_seconds: float,
                 probe: Callable[[], list[BlockedIn]] = blocked_collectives,
                 p2p_probe: Callable[[], list[P2PInFlight]] = p2p_waits,
                 main_thread_phase: Callable[[], Phase | None] | None = None,
                 main_thread_cpu: Callable[[], float | None] | None = None,
                 main_thread_site: Callable[[], str | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.board = board
        self.heartbeat = heartbeat
        self.poll_interval_seconds = poll_interval_seconds
        self._probe = probe
        self._p2p_probe = p2p_probe
        self._main_thread_phase = main_thread_phase or read_main_thread_phase
        self._main_thread_cpu = main_thread_cpu or read_main_thread_cpu
        self._main_thread_site = main_thread_site or read_main_thread_site
        self._cpu_sample: tuple[float, float] | None = None
        self._clock = clock
        self._pending: tuple[int, float] | None = None
        """(changes counter, time) of a hang picture waiting for its confirming poll."""
        self._fired_changes: int | None = None
        self._unfinished_at_start: frozenset[BlockedIn] = frozenset()
        """Ops already unfinished when this watchdog started: a destroyed group's leftovers (the
        recorder keeps the status of groups of an earlier Trainer in this process), never this
        run's wait."""
        self._learned: dict[str, float] = {}
        """site -> the wait learnt there from a recovery (see :meth:`learn_recovery`)."""
        self._ping: _Ping | None = None
        """Rank 0's outstanding ping of the ranks that posted nothing."""
        self.probes = 0

    @property
    def evaluates(self) -> bool:
        """Rank 0 always; the deputy (rank 1) only while its own notice is up, and only for a
        rank 0 that cannot run its watchdog (nothing in steady state)."""
        return self.board.rank == 0 or (self.board.rank == DEPUTY_RANK and self.board.posted is not None)

    def start(self) -> None:
        self._unfinished_at_start = frozenset(self._probe())
        self.board.start()

    def stop(self) -> None:
        self.board.stop()

    @property
    def silence_seconds(self) -> float:
        return max(SILENCE_SECONDS, 4 * self.poll_interval_seconds)

    def tick(self, pinged: bool = False) -> Picture | None:
        """Update this rank's notice; on rank 0, the picture once it is a confirmed hang.
        ``pinged``: this rank's bell rang since the last tick, or it has no doorbell (then every
        tick looks for a ping to answer)."""
        if pinged:
            self.board.answer_ping()
        self._update_notice()
        if not self.evaluates:
            self._pending = self._ping = None
            return None
        picture = self._decide()
        if picture is not None and self.board.rank != 0 and 0 not in picture.unanswered:
            return None  # rank 0 decides that one
        return picture

    # ------------------------------------------------------------------ sites and recoveries
    def site_now(self) -> str | None:
        """Where this rank's main thread is now: the Lightning hook it runs (``Callback.on_train_batch_end
        of Uploader``) and its innermost frame of user code (``train.py:88 in upload``), stable across
        steps and epochs; None when its stack cannot be read."""
        try:
            return self._main_thread_site()
        except Exception:  # noqa: BLE001 - a site is a hint, never a reason to fail
            log.debug("reading the main thread's site failed", exc_info=True)
            return None

    def learn_recovery(self, site: str | None, lasted_seconds: float) -> None:
        """A wait at ``site`` (as :meth:`site_now` gave it when this rank dumped for an event) ended
        by itself after ``lasted_seconds``: from now on this rank posts no notice while its main
        thread is at that site until it has waited ``RECOVERY_WAIT_FACTOR`` x that long (the
        largest of what it learnt there). Nothing is learnt without a site."""
        try:
            lasted = float(lasted_seconds)
        except (TypeError, ValueError):
            return
        if not site or not math.isfinite(lasted) or lasted <= 0:
            return
        wait = RECOVERY_WAIT_FACTOR * lasted
        if wait <= self._learned.get(site, 0.0):
            return
        if site not in self._learned and len(self._learned) >= MAX_LEARNED_SITES:
            self._learned.pop(min(self._learned, key=self._learned.__getitem__))
        self._learned[site] = wait
        log.info("[rank %d] consensus: a wait at %s recovered after %.1f s; this rank's wait there is now %.1f s",
                 self.board.rank, site, lasted, wait)

    def learned_wait(self, site: str | None) -> float | None:
        return self._learned.get(site) if site else None

    # ------------------------------------------------------------------ this rank's notice
    def _main_thread_working(self) -> bool:
        """True when the main thread used ``WORKING_CPU_SHARE`` of a CPU since the last poll
        (sampled at every poll, so the first notice already knows)."""
        now, cpu = self._clock(), self._main_thread_cpu()
        previous, self._cpu_sample = self._cpu_sample, (now, cpu) if cpu is not None else None
        if previous is None or cpu is None or now <= previous[0]:
            return False
        return (cpu - previous[1]) / (now - previous[0]) >= WORKING_CPU_SHARE

    def _expected_longer(self, waited: float, beat_seq: int) -> bool:
        """Compiling or saving (a long step is expected), or at a site where a wait this long
        recovered before. A step that waits at such a site is no step time (the heartbeat
        forgets it): else one learnt wait would raise every wait learnt from steps."""
        if self._main_thread_phase() is not None:
            return True
        if not self._learned:
            return False
        learned = self.learned_wait(self.site_now())
        if learned is not None and waited <= learned:
            self.heartbeat.forget_stall(beat_seq)
            return True
        return False

    def _update_notice(self) -> None:
        working = self._main_thread_working()
        beat = self.heartbeat.last
        wait = self.heartbeat.consensus_wait()
        waited = self._clock() - beat.time
        posted = self.board.posted
        if posted is not None and posted.beat != beat.seq:
            self.board.withdraw()
            posted = None
        if wait is None or beat.phase is not Phase.train_step or waited <= wait or self._expected_longer(waited, beat.seq):
            if posted is not None:
                self.board.withdraw()
            return
        self.probes += 1
        blocked = tuple(b for b in self._probe() if b not in self._unfinished_at_start)
        p2p = tuple(sorted({P2PWait(w.backend, w.group, w.op_id, w.op, w.peer) for w in self._p2p_probe()}))
        notice = OverrunNotice(rank=self.board.rank, beat=beat.seq, step=beat.step, blocked=blocked,
                               waited_seconds=waited, working=working, p2p=p2p)
        if not notice.same_as(posted):
            self.board.post(notice)

    # ------------------------------------------------------------------ rank 0's decision
    def _needed(self) -> int:
        return max(1, math.ceil(self.config.quorum * self.board.world_size - 1e-9))

    def _decide(self) -> Picture | None:
        posted, changes = self.board.counters()
        if posted < self._needed() or changes == self._fired_changes:
            self._pending = None
            self._ping = None
            return None
        now = self._clock()
        if self._pending is not None and self._pending[0] == changes:
            if now - self._pending[1] < self.poll_interval_seconds * 0.9:
                return None
            picture = self._picture(changes)
            _, changes_after = self.board.counters()
            if picture is None or changes_after != changes or not picture.is_hang(self.config.quorum):
                self._pending = None
                return None
            self._fired_changes = changes
            self._pending = None
            self._ping = None
            return picture
        picture = self._picture(changes)
        if picture is None or not picture.is_hang(self.config.quorum):
            self._pending = None
            return None
        if picture.unanswered and self._ping is not None and self._ping.changes == changes:
            # no notice changed during the whole silence (several polls): confirmed already
            self._fired_changes = changes
            self._ping = None
            return picture
        self._pending = (changes, now)
        return None

    def _picture(self, changes: int) -> Picture | None:
        """Every notice; where a quorum is blocked and the others posted nothing, with the silent
        ranks that have not answered a ping for ``silence_seconds``."""
        notices = self.board.read_all()
        if notices is None:
            return None
        picture = Picture(self.board.world_size, notices)
        silent = tuple(picture.silent)
        if not silent or picture.working or len(picture.blocked) < self._needed():
            self._ping = None
            return picture
        unanswered = self._unanswered(silent, changes)
        return Picture(self.board.world_size, notices, unanswered) if unanswered else picture

    def _unanswered(self, silent: tuple[int, ...], changes: int) -> tuple[int, ...]:
        """``silent`` once none of them answered a ping sent ``silence_seconds`` ago; () meanwhile.
        This rank (it runs) or too many silent ranks: () and no ping."""
        if self.board.rank in silent or len(silent) > MAX_PINGED_RANKS:
            self._ping = None
            return ()
        now, ping = self._clock(), self._ping
        if ping is None or ping.ranks != silent:
            self._ping = _Ping(self.board.ping(silent), now, silent, changes)
            return ()
        if self.board.answered(silent, ping.number):
            if now - ping.sent >= self.silence_seconds:  # alive then; ask again, it may stop later
                self._ping = _Ping(self.board.ping(silent), now, silent, changes)
            return ()
        return silent if now - ping.sent >= self.silence_seconds else ()


class MainThreadWork:
    """Seconds the main thread has worked, as a running total (Linux ``/proc``: ``schedstat``,
    else the CPU time of ``stat``); None where neither can be read.

    Time on a CPU counts; so does time waiting in the run queue for one, in the share of the
    thread's context switches since the last reading that were preemptions (``status``:
    ``nonvoluntary_ctxt_switches``). On a host with more runnable threads than CPUs (data loader
    workers, other jobs) a busy main thread gets well under ``WORKING_CPU_SHARE`` of a CPU and is
    preempted at every time slice: it is working, not waiting. A thread that sleeps or blocks
    switches out by itself; the run-queue wait of its many short wake-ups (a polling loop on a
    crowded CPU) is not work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._total = 0.0

    def __call__(self) -> float | None:
        tid = threading.main_thread().native_id
        with self._lock:
            try:
                with open(f"/proc/self/task/{tid}/schedstat", "rb") as handle:
                    on_cpu_ns, run_delay_ns = (int(v) for v in handle.read().split()[:2])
                voluntary, preempted = _context_switches(tid)
            except (OSError, IndexError, ValueError):
                return _cpu_time_from_stat(tid)
            last = self._last
            switches = (voluntary - last[2]) + (preempted - last[3])
            preempted_share = (preempted - last[3]) / switches if switches > 0 else 0.0
            self._total += (on_cpu_ns - last[0] + (run_delay_ns - last[1]) * preempted_share) / 1e9
            self._last = (on_cpu_ns, run_delay_ns, voluntary, preempted)
            return self._total


def _context_switches(tid: int) -> tuple[int, int]:
    """(voluntary, nonvoluntary) context switches of one thread of this process."""
    found: dict[bytes, int] = {}
    with open(f"/proc/self/task/{tid}/status", "rb") as handle:
        for line in handle:
            if line.startswith((b"voluntary_ctxt_switches:", b"nonvoluntary_ctxt_switches:")):
                key, _, value = line.partition(b":")
                found[key] = int(value)
    return found[b"voluntary_ctxt_switches"], found[b"nonvoluntary_ctxt_switches"]


def _cpu_time_from_stat(tid: int) -> float | None:
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


read_main_thread_cpu = MainThreadWork()
"""This process's reader (one running total: the consensus samples it at every poll)."""


try:
    _CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    _CLOCK_TICKS = 100.0
