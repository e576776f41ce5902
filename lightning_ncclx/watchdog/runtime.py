"""The per-rank watchdog thread and the dump events it runs.

Created in ``StallWatchdog.setup`` (never pickled), stopped on teardown and on exception. Every
poll interval the thread (1) follows the events this rank took part in until their outcome
(:mod:`participation`), (2) takes part in an event another rank started, when its doorbell rang
(:mod:`lightning_ncclx.events.doorbell`; without one it asks the store every interval), (3)
starts an on-demand event when the signal flag is set, (4) on rank 0, asks the consensus whether
every rank agrees on a hang, (5) starts a stall event when the heartbeat is older than its phase's
threshold. It never calls a collective, and nothing it does raises into training: errors are
logged. Its store connection is opened from the thread itself (``setup`` never waits on the
network) and shared with the consensus and straggler detection.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.alerts import AlertNotifier
from lightning_ncclx.alerts.claim import ClaimBoard
from lightning_ncclx.config import AlertsConfig, StallAction, WatchdogConfig, exit_code_for
from lightning_ncclx.dump.native_stacks import NativeStackTimer
from lightning_ncclx.dump.writer import format_stacks
from lightning_ncclx.events.connection import StoreAddress, StoreClient, StoreUnavailable, release_client, shared_client
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.doorbell import Doorbell
from lightning_ncclx.events.gather import CollectionResult, gather_and_summarize, wait_for_reports
from lightning_ncclx.events.liveness import this_process
from lightning_ncclx.events.wire import EventMeta
from lightning_ncclx.watchdog.activity import main_thread_phase
from lightning_ncclx.watchdog.consensus import Consensus, ConsensusBoard, Picture
from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase, Stall
from lightning_ncclx.watchdog import observer_hold
from lightning_ncclx.watchdog.participation import EXIT_WAIT_MARGIN_SECONDS, EventParticipation, scaled
from lightning_ncclx.watchdog.store_lost import dump_without_store, store_lost_name
from lightning_ncclx.watchdog.teardown_guard import guard_exit
from lightning_ncclx.watchdog.triggers import FileTrigger, SignalWakeup, checks_file_trigger

log = logging.getLogger(__name__)

LEAVE_WAIT_SECONDS = 5.0
"""How long the store's host waits for every rank to say it leaves (plus a second per 256 ranks)."""
ON_DEMAND_MIN_GAP_SECONDS = 5.0
"""A second request within this long after an on-demand dump is ignored (a signal sent to every
rank at once is one request)."""
PARENT_EXIT_WAIT_SECONDS = 30.0
"""How long a rank started by another rank's process waits for that parent to exit first."""
ARM_RETRY_SECONDS = 5.0
STORE_PROBE_AFTER_SECONDS = 2.0
"""An exception whose rank's watchdog stays busy this long asks whether the store still answers."""
STORE_PROBE_TIMEOUT_SECONDS = 2.0


def _job_identity() -> tuple[int, int, Any]:
    """(rank, world size, store) of the running job; a private in-memory store without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from lightning_ncclx.backend.torch_api import default_store

        return dist.get_rank(), dist.get_world_size(), default_store()
    return 0, 1, dist.HashStore()


class WatchdogRuntime:
    """Thread, store client, signal handler and event bookkeeping of one rank."""

    def __init__(self, config: WatchdogConfig, dump_dir: Path, *, stack_traces: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 exit_fn: Callable[[int], None] | None = None, alerts: AlertsConfig | None = None) -> None:
        self.config = config
        self.dump_dir = Path(dump_dir)
        self.stack_traces = stack_traces
        self.heartbeat = Heartbeat(config, clock=clock)
        self.rank, self.world_size, job_store = _job_identity()
        self.alerts = (AlertNotifier(alerts, rank=self.rank) if alerts is not None and alerts.enabled
                       and alerts.has_sink else None)
        self._store_address = StoreAddress.of(job_store)
        self.client: StoreClient = shared_client(job_store, op_timeout_seconds=config.poll_interval_seconds)
        self.coordinator = EventCoordinator(
            self.client, self.rank, self.world_size, clock=clock,
            stale_after_seconds=scaled(config.collect_timeout_seconds + 2 * EXIT_WAIT_MARGIN_SECONDS, self.world_size))
        self.coordinator.name_taken = lambda name: (self.dump_dir / name).exists()
        self.doorbell = self._open_doorbell(job_store)
        self.coordinator.rings_doorbells = self.doorbell is not None
        self.coordinator.serves_store = (self._store_address is not None and self.rank == 0
                                         and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true")
        self.coordinator.store_host_address = self._store_address.host if self._store_address is not None else None
        if self._store_address is not None and not self.coordinator.serves_store:
            self.coordinator.store_port = self._store_address.port
        self._poll_again = True
        """Ask the store for the next event at the next tick even without a ring (at the start,
        and after an event: another may have followed it)."""
        self.consensus = Consensus(config.consensus, ConsensusBoard(self.client, self.rank, self.world_size),
                                   self.heartbeat, poll_interval_seconds=config.poll_interval_seconds, clock=clock)
        self.consensus.board.rings_doorbells = self.doorbell is not None
        self.participation = EventParticipation(self)
        self._armed = False
        self._next_arm = 0.0
        self._consensus_failures = 0
        self.detection: dict | None = None
        """How the stall this rank is starting now was found (context.json ``detection``)."""
        self.stall_events = 0
        self.on_demand_events = 0
        self.events_taken_part = 0
        self.results: list[CollectionResult] = []
        self.cuda_device: int | None = None
        """The rank's CUDA device index, for the memory figures in context.json."""
        self.on_dumped: Callable[[str], None] | None = None
        """Called from the watchdog thread after each dump of this rank, with the event's reason."""
        self.on_summarized: Callable[[str, str, dict], None] | None = None
        """Called on the initiating rank after an event's summary is written (hang kind known)."""
        self.stragglers_writer: Callable[[Path], Any] | None = None
        """Handed over by the callback where straggler detection runs: writes its scores into an
        event folder (``stragglers.json``)."""
        self._exit_fn = exit_fn or _hard_exit
        self._event_lock = threading.Lock()
        self._stop = threading.Event()
        self._exiting = threading.Event()
        """Set once the thread leaves the job with an event's status (``exit_job``)."""
        self._leaving_for: int | None = None
        """The number of the event whose status this rank leaves the job with: confirmed here,
        whatever its heartbeat does next (a peer's death makes the main thread raise, which beats)."""
        self._signal_requested = False
        self._wakeup = SignalWakeup(config.on_demand_signal)
        self._native = NativeStackTimer(self.dump_dir, self.rank)
        self._file_trigger = FileTrigger(self.dump_dir, config.on_demand_file, checker=checks_file_trigger())
        self._last_on_demand = -math.inf
        self._on_demand_limit_logged = False
        self._allowance_logged = -1
        self._stall_logged = -1
        self._incident: tuple[EventMeta, int] | None = None
        """The last stall or exception event this rank dumped for, with its training batches
        then; cleared by a recovery (see :meth:`_follows_incident`)."""
        self._clock = clock
        self._thread = threading.Thread(target=self._run, name=f"ncclx-watchdog-rank{self.rank}", daemon=True)

    def _open_doorbell(self, job_store: Any) -> Doorbell | None:
        if not self.config.event_doorbell or self.world_size < 2:
            return None
        return Doorbell.for_store(job_store, self.client, self.rank, on_ring=lambda: self._wakeup.wake())

    # ------------------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Main thread: the signal handler and the threads; no store request (the thread
        registers with the store first thing, see :meth:`_ensure_armed`)."""
        try:
            observer_hold.install()
        except Exception:  # noqa: BLE001 - a Lightning whose observer looks different: left as it is
            log.warning("[rank %d] could not hold Lightning's child-process observer during summaries", self.rank,
                        exc_info=True)
        if self.doorbell is not None:
            self.doorbell.start()
        try:
            self._wakeup.install()
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] could not install the %s handler", self.rank, self.config.on_demand_signal,
                        exc_info=True)
        if self.config.native_stacks:
            try:
                self._native.start()
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] the native stack timer could not start", self.rank, exc_info=True)
        self._thread.start()
        log.debug("[rank %d] stall watchdog started, dumps go to %s", self.rank, self.dump_dir)

    def _ensure_armed(self) -> bool:
        """Once, from the thread (retried every ``ARM_RETRY_SECONDS`` while the store cannot
        answer): skip earlier events, register this process, post the empty consensus report."""
        if self._armed or self._clock() < self._next_arm:
            return self._armed
        try:
            past = self.coordinator.skip_past_events()
            if past:
                log.debug("[rank %d] %d earlier dump event(s) in the store: skipped", self.rank, past)
            self.coordinator.register_process(this_process(self.rank))
        except Exception:  # noqa: BLE001 - a store that cannot answer now: retried
            self._next_arm = self._clock() + ARM_RETRY_SECONDS
            log.warning("[rank %d] could not read earlier dump events or register this process in the store; "
                        "retrying in %.0f s", self.rank, ARM_RETRY_SECONDS, exc_info=True)
            return False
        if self.config.consensus.enabled:
            try:
                self.consensus.start()
            except Exception:  # noqa: BLE001 - without its key, rank 0 never decides: the threshold still works
                log.warning("[rank %d] could not register for consensus hang detection", self.rank, exc_info=True)
        self._armed = True
        return True

    def stop(self, timeout_seconds: float | None = None) -> None:
        self._stop.set()
        self.participation.stop_pulse()
        self.drain_alerts()
        self._wakeup.uninstall()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_seconds if timeout_seconds is not None else max(2.0, 4 * self.config.poll_interval_seconds))
            if self._thread.is_alive():
                log.warning("[rank %d] watchdog thread still busy at shutdown; left behind (daemon)", self.rank)
                return
        if self.doorbell is not None:
            self.doorbell.stop()
        if self.config.consensus.enabled:
            log.info("[rank %d] consensus: %d report(s) posted in this run (a step overran its wait)", self.rank,
                     self.consensus.board.posts)
            try:
                self.consensus.stop()
            except Exception:  # noqa: BLE001 - the store's host may have gone first
                log.debug("[rank %d] removing the consensus key failed", self.rank, exc_info=True)
        self._wakeup.close()
        release_client(self.client)
        try:
            self._native.stop()
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] stopping the native stack timer failed", self.rank, exc_info=True)

    @property
    def signal_handler(self) -> Any:
        """The on-demand signal's handler object while installed (for launchers that save and restore tables)."""
        return self._wakeup.handler

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def keep_signal_armed(self) -> None:
        """Between steps (main thread) and at every poll (the thread): undo a native library's
        reset of the on-demand signal to its default action, which would end the process."""
        try:
            self._wakeup.keep_armed()
        except Exception:  # noqa: BLE001 - never into training
            log.warning("[rank %d] checking the %s handler failed", self.rank, self.config.on_demand_signal,
                        exc_info=True)

    # ------------------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            with self._event_lock:
                self._ensure_armed()
        except Exception:  # noqa: BLE001 - retried at every tick
            log.warning("[rank %d] registering with the store failed", self.rank, exc_info=True)
        while not self._stop.is_set():
            self._native.arm(self._starvation_seconds())
            if self._wakeup.wait(self.config.poll_interval_seconds):
                self._signal_requested = True
            if self._stop.is_set():
                return
            self.keep_signal_armed()
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - e.g. the store went away at the end of the job
                if self._stop.is_set():
                    return
                log.warning("[rank %d] watchdog poll failed", self.rank, exc_info=True)
                self._stop.wait(5.0)

    def _tick(self) -> None:
        with self._event_lock:
            if not self._ensure_armed():
                return
            rung = self.doorbell.take() if self.doorbell is not None else False
            self.participation.follow(rung=rung)
            if self._stop.is_set():
                return
            if self._poll_again or rung or not self.listening():
                try:
                    event = self.coordinator.poll()
                except StoreUnavailable:  # its host may have died: this rank's own stall check still runs
                    log.debug("[rank %d] polling for events failed", self.rank, exc_info=True)
                    event = None
                self._poll_again = event is not None
                if event is not None:
                    self._take_part(event)
                    return
            if self._file_trigger.taken(self._clock()):
                self._signal_requested = True
            if self._signal_requested:
                self._signal_requested = False
                self._on_demand()
                return
            picture = self._consensus_tick(pinged=rung or not self.listening())
            if picture is not None:
                self._stall_by_consensus(picture)
                return
            stall = self.heartbeat.check()
            if stall is None or self._allowed_longer(stall):
                return
            if self._stall_logged != stall.seq:
                self._stall_logged = stall.seq
                log.warning("[rank %d] stall: no heartbeat for %.1f s in phase %s (threshold %.1f s, batch %d)",
                            self.rank, stall.seconds_since_heartbeat, stall.phase.value, stall.threshold_seconds,
                            stall.step)
            if self.stall_events >= self.config.max_dumps_per_run:
                self.heartbeat.mark_reported(stall.seq)
                log.warning("[rank %d] max_dumps_per_run=%d reached: not dumping", self.rank,
                            self.config.max_dumps_per_run)
                return
            if self._still_in_incident("is still stuck"):
                self.heartbeat.mark_reported(stall.seq)
                return
            if self._start_event("stall"):  # else no event could be taken now: tried again at the next tick
                self.heartbeat.mark_reported(stall.seq)

    def _start_event(self, reason: str) -> bool:
        """Propose an event and take part in the one agreed on; False when none could be taken.
        A stall whose event cannot reach the store is dumped here alone (:mod:`store_lost`)."""
        try:
            event = self.coordinator.propose(reason)
        except StoreUnavailable as error:
            if reason != "stall":
                raise
            self._dump_without_store(reason, None, error)
            return True
        if event is None:
            return False
        # two ranks that propose at once get the same event back: only the one that opened it started it
        self._take_part(event, detected=event.initiator == self.rank)
        self._poll_again = True  # another event may have followed it
        return True

    def _consensus_tick(self, pinged: bool) -> Picture | None:
        if not self.config.consensus.enabled:
            return None
        try:
            picture = self.consensus.tick(pinged=pinged)
        except Exception:  # noqa: BLE001 - the step threshold still watches this rank
            self._consensus_failures += 1
            if self._consensus_failures in (1, 10, 100) or self._consensus_failures % 1000 == 0:
                log.warning("[rank %d] consensus hang detection failed (%d time(s))", self.rank,
                            self._consensus_failures, exc_info=True)
            return None
        return picture

    def _stall_by_consensus(self, picture: Picture) -> None:
        beat = self.heartbeat.last
        log.warning("[rank %d] stall by consensus of every rank: %s", self.rank, picture.describe())
        if self._still_in_incident("is still stuck"):
            self.heartbeat.mark_reported(beat.seq)
            return
        if self.stall_events >= self.config.max_dumps_per_run:
            log.warning("[rank %d] max_dumps_per_run=%d reached: not dumping", self.rank, self.config.max_dumps_per_run)
            self.heartbeat.mark_reported(beat.seq)
            return
        self.detection = {"by": "consensus", "picture": picture.describe(),
                          "blocked_ranks": sorted(picture.blocked), "busy_ranks": picture.busy,
                          "silent_ranks": sorted(picture.unanswered)}
        try:
            self._start_event("stall")
        finally:
            self.detection = None

    def _starvation_seconds(self) -> float:
        """How long this thread may go without running before its rank's stacks are written
        natively: the current phase's threshold (a stall it would have reported by then)."""
        threshold = self.heartbeat.threshold(self.heartbeat.last.phase)
        return (threshold if math.isfinite(threshold) else 3600.0) + 2 * self.config.poll_interval_seconds

    def _allowed_longer(self, stall: Stall) -> bool:
        """True while the main thread is compiling or saving a checkpoint within that phase's
        threshold (a recompile after a shape change happens at any step)."""
        if stall.phase not in (Phase.train_step, Phase.epoch_start, Phase.validation):
            return False
        try:
            phase = main_thread_phase()
        except Exception:  # noqa: BLE001 - without the stack, the step threshold applies
            log.warning("[rank %d] reading the main thread's stack failed", self.rank, exc_info=True)
            return False
        if phase is None or stall.seconds_since_heartbeat > self.heartbeat.threshold(phase):
            return False
        if self._allowance_logged != stall.seq:
            self._allowance_logged = stall.seq
            log.info("[rank %d] step over its %.1f s threshold while %s: allowing up to %.0f s", self.rank,
                     stall.threshold_seconds, "compiling" if phase is Phase.first_step else "saving a checkpoint",
                     self.heartbeat.threshold(phase))
        return True

    def _on_demand(self) -> None:
        if self._clock() - self._last_on_demand <= ON_DEMAND_MIN_GAP_SECONDS:
            log.info("[rank %d] on-demand dump asked again within %.0f s: ignored", self.rank, ON_DEMAND_MIN_GAP_SECONDS)
            return
        if self.on_demand_events >= self.config.max_on_demand_dumps:
            if not self._on_demand_limit_logged:
                log.warning("[rank %d] max_on_demand_dumps=%d reached: no more on-demand dumps in this run", self.rank,
                            self.config.max_on_demand_dumps)
                self._on_demand_limit_logged = True
            return
        self._start_event("on_demand")

    # ------------------------------------------------------------------------------ events
    def _take_part(self, event: EventMeta, exception: str | None = None, *,
                   detected: bool = False) -> CollectionResult | None:
        """Caller holds ``_event_lock``. ``detected``: this rank started it (a stall it found
        counts against ``max_dumps_per_run``; one another rank or client started does not). See
        :mod:`participation`."""
        batches = self.heartbeat.batches
        result = self.participation.take_part(event, exception, detected=detected)
        if event.reason in ("stall", "exception"):
            self._incident = (event, batches)
        return result

    def _store_answers(self) -> bool:
        """Whether a new connection to the job's TCPStore opens (True where that cannot be tried)."""
        if self._store_address is None:
            return True
        try:
            self._store_address.connect(connect_timeout_seconds=STORE_PROBE_TIMEOUT_SECONDS)
        except Exception:  # noqa: BLE001 - refused, reset or timed out: its host is gone
            log.debug("[rank %d] the job's store does not answer", self.rank, exc_info=True)
            return False
        return True

    def _dump_without_store(self, reason: str, exception: str | None, error: BaseException) -> None:
        """Once per incident: this rank's dump, stacks and a note, without the store."""
        self.native_stacks_disarm()
        dump_without_store(self.dump_dir, rank=self.rank, number=self.coordinator.last_seen + 1, reason=reason,
                           exception=exception, error=error,
                           progress=dict(self.heartbeat.progress(), stall_events=self.stall_events),
                           stack_traces=self.stack_traces, cuda_device=self.cuda_device)
        number = self.coordinator.last_seen + 1
        self._incident = (EventMeta.new(number, reason, self.rank, time.time(), store_lost_name(number)),
                          self.heartbeat.batches)

    def _follows_incident(self) -> EventMeta | None:
        """The stall or exception event this rank dumped for, when no training batch ended since
        and it did not recover: what fails now follows from that incident's culprit (a peer's
        exception, then its dead connection here)."""
        if self._incident is None:
            return None
        event, batches = self._incident
        return event if self.heartbeat.batches == batches else None

    def _still_in_incident(self, what: str) -> bool:
        """True (and logged) when a new stall or exception event would only repeat the incident
        this rank already dumped for: no second event, whose summary (the culprit's process now
        gone) would contradict the first's verdict and restart advice."""
        earlier = self._follows_incident()
        if earlier is None:
            return False
        log.warning("[rank %d] %s since %s (initiator rank %d), which this rank dumped for, without a training "
                    "batch since: part of that incident, no new event (its summary has the culprit and the advice)",
                    self.rank, what, earlier.name, earlier.initiator)
        return True

    def native_stacks_disarm(self) -> None:
        self._native.disarm()

    def note_on_demand(self) -> None:
        self._last_on_demand = self._clock()
        self.on_demand_events += 1

    def clock(self) -> float:
        return self._clock()

    def listening(self) -> bool:
        return self.doorbell is not None and self.doorbell.listening

    def allowed_exit_codes(self) -> set[int]:
        return {self.config.exit_code, *self.config.exit_codes.values()}

    def site_now(self) -> str | None:
        """Where the main thread is (for the consensus to learn from a recovery), if it can tell."""
        site_now = getattr(self.consensus, "site_now", None)
        if site_now is None:
            return None
        try:
            return site_now()
        except Exception:  # noqa: BLE001
            log.debug("[rank %d] reading the main thread's site failed", self.rank, exc_info=True)
            return None

    def learn_recovery(self, site: str | None, seconds: float) -> None:
        self._incident = None  # the job moved on: a later failure is a new incident
        learn = getattr(self.consensus, "learn_recovery", None)
        if learn is None:
            return
        try:
            learn(site, seconds)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] recording the recovered wait failed", self.rank, exc_info=True)

    def write_side_files(self, folder: Path) -> None:
        """What other parts of the plugin know, into the event folder (the straggler scores)."""
        writer = self.stragglers_writer
        if writer is None:
            return
        try:
            writer(folder)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] writing stragglers.json into %s failed", self.rank, folder, exc_info=True)

    def notify_dumped(self, reason: str) -> None:
        if self.on_dumped is None:
            return
        try:
            self.on_dumped(reason)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] recording the dump event in the loggers failed", self.rank, exc_info=True)

    def report_kind(self, event: EventMeta, kind: str | None, advice: dict | None) -> None:
        if self.on_summarized is None or not kind:
            return
        try:
            self.on_summarized(event.name, kind, advice or {})
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] recording the hang kind of %s failed", self.rank, event.name, exc_info=True)

    def summarize(self, event: EventMeta, folder: Path) -> CollectionResult:
        with observer_hold.summarizing():
            result = gather_and_summarize(
                self.coordinator, event, folder, dump_dir=self.dump_dir,
                collect_timeout_seconds=scaled(self.config.collect_timeout_seconds, self.world_size),
                gather_through_store=self.config.gather_through_store,
                two_phase=self.config.two_phase_gather(self.world_size),
                two_phase_peers=self.config.two_phase_gather_peers,
                silent_ranks=frozenset((self.detection or {}).get("silent_ranks", ())),
            )
        self.results.append(result)
        self.arm_alert_claim(event, result)
        self.report_kind(event, result.hang_kind, result.restart_advice)
        read = sorted({i.rank for i in getattr(result.summary, "inputs", ())})
        header = (f"[rank {self.rank}] {event.name}: "
                  + (f"dumps from ranks {read}" if read else "no dump could be written or read")
                  + (f", NO dump from ranks {result.missing_ranks}" if result.missing_ranks else "")
                  + (f" (process gone: ranks {result.gone_ranks})" if result.gone_ranks else "")
                  + f"; verdict {result.verdict}, culprit ranks {result.culprit_ranks}; folder {folder}")
        log.warning(header)
        if result.refused:
            log.warning("[rank %d] %s: %d store value(s) refused (see collection.json): %s", self.rank, event.name,
                        len(result.refused), "; ".join(result.refused[:3]))
        if result.text:
            log.warning("\n".join(f"[rank {self.rank}] {line}" for line in result.text.splitlines()))
        return result

    def leave(self, event: EventMeta) -> None:
        """Leave in an order every launcher reports as the watchdog's exit status, not as a kill: the store's
        host (rank 0) waits for every rank to say it leaves; a rank started by another rank's
        process (Lightning's popen launcher) waits until that parent has exited, because the
        parent SIGKILLs itself and every other rank as soon as it sees a child exit."""
        parent = None
        try:
            parent = self.coordinator.launcher_parent()
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] could not tell whether another rank started this process", self.rank,
                        exc_info=True)
        try:
            # the others leave once their own step overran (participation): wait that long too
            wait = LEAVE_WAIT_SECONDS + self.heartbeat.overrun_bar()
            self.coordinator.leaving(event, timeout_seconds=scaled(wait, self.world_size))
            if self.rank == 0:
                self.coordinator.forget(event)
        except Exception:  # noqa: BLE001 - the store's host is already gone
            log.debug("announcing the exit failed", exc_info=True)
        if parent is not None and not _wait_for_reparenting(parent.pid, PARENT_EXIT_WAIT_SECONDS):
            log.warning("[rank %d] the launching process (rank %d, pid %d) is still there after %.0f s; exiting "
                        "anyway", self.rank, parent.rank, parent.pid, PARENT_EXIT_WAIT_SECONDS)

    def exit_job(self, event: EventMeta, exit_code: int) -> None:
        log.error("[rank %d] %s: on_stall=dump_and_exit, exiting with code %d", self.rank, event.name, exit_code)
        self._leaving_for = event.number
        self._exiting.set()
        self._stop.set()
        if event.initiator != self.rank and self.alerts is not None:  # its sender may have died since the last look
            self.alerts.take_over(self.dump_dir / event.name, event.number)
        self.drain_alerts()  # before leaving: the others' exit (and a launcher's kill) follows that
        self.leave(event)
        wait_for_reports()  # the reports after summary.json, written while the others left
        self._exit_fn(exit_code)

    def alert(self, action: str, opened: Any, *, exit_code: int | None = None, lasted_seconds: float = 0.0) -> None:
        """Send (in the background) the trigger or resolve alert of an event this rank summarized."""
        notifier, result = self.alerts, opened.result
        if notifier is None or result is None:
            return
        if action == "trigger":
            notifier.trigger(result.folder, event=opened.event.name, reason=opened.event.reason, exit_code=exit_code,
                             number=opened.event.number, opened=opened.event.opened)
        else:
            notifier.resolve(result.folder, event=opened.event.name, lasted_seconds=lasted_seconds)

    def take_over_alerts(self, opened: Any) -> None:
        """Send the alerts of an event another rank summarized when that rank's process died while
        sending them (same host: the event folder and ``/proc`` are this rank's to read)."""
        if self.alerts is not None:
            self.alerts.take_over(self.dump_dir / opened.event.name, opened.event.number)
            self.watch_alert_claim(opened)

    def release_alert_claim(self, event: EventMeta) -> None:
        """The summarizing rank sends no trigger for ``event`` (it recovered or expired here)."""
        if self.alerts is not None:
            self.alerts.release_claim(event.number)

    def _alert_claims(self) -> AlertNotifier | None:
        """The notifier, with the job-wide claims of :mod:`~lightning_ncclx.alerts.claim` attached."""
        notifier = self.alerts
        if notifier is not None and notifier.claims is None:
            notifier.attach_claims(ClaimBoard(self.client, self.rank, self.world_size, clock=self._clock))
        return notifier

    def arm_alert_claim(self, event: EventMeta, result: CollectionResult) -> None:
        """The summarizing rank, once the summary is written: the trigger a stall or an exception
        would send, armed in the job's store, with when this rank sends it (the rule of
        ``EventParticipation._arm_alert``: an exception at once, a stall once its heartbeat has not
        moved for ``confirm_seconds``, at the latest at the step threshold)."""
        notifier = self._alert_claims()
        if notifier is None or event.reason not in ("stall", "exception"):
            return
        exiting = self.config.on_stall is StallAction.dump_and_exit
        within = 0.0
        if event.reason == "stall":
            bar = min(notifier.config.confirm_seconds, self.heartbeat.threshold(Phase.train_step))
            within = max(0.0, self.heartbeat.last.time + bar - self.clock())
        notifier.arm(result.folder, number=event.number, event=event.name, reason=event.reason,
                     exit_code=exit_code_for(result.hang_kind, self.config) if exiting else None,
                     claim_within_seconds=within, opened=event.opened)

    def watch_alert_claim(self, opened: Any) -> None:
        """A rank following a stall or an exception that its own heartbeat confirms (the
        summarizing rank's rule) watches the job-wide claim of its trigger: sent by this rank
        when the rank holding it is gone, whatever host it was on."""
        notifier = self._alert_claims()
        event = opened.event
        if notifier is None or event.reason not in ("stall", "exception"):
            return
        confirmed_at = opened.beat_time
        if event.reason == "stall":
            if self.heartbeat.last.seq != opened.beat_seq:
                return  # moving on: not a confirmed hang from here
            confirmed_at += min(notifier.config.confirm_seconds, self.heartbeat.threshold(Phase.train_step))
        notifier.watch_claim(self.dump_dir / event.name, number=event.number, event=event.name,
                             reason=event.reason, initiator=event.initiator, confirmed_at=confirmed_at,
                             initiator_alone=event.alone, opened=event.opened,
                             initiator_host=event.host_ranks if event.store_host else None,
                             on_store_host=self.coordinator.on_store_host(),
                             still_confirmed=lambda: event.reason == "exception"
                             or self.heartbeat.last.seq == opened.beat_seq or self._leaving_for == event.number,
                             read_now=self.clock() >= confirmed_at)

    def drain_alerts(self) -> None:
        """Before this process ends: wait for alerts being sent, at most ``ncclx.alerts.deadline_seconds``."""
        if self.alerts is not None:
            try:
                self.alerts.drain()
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] waiting for the alerts failed", self.rank, exc_info=True)

    def guard_exit(self) -> None:
        """After the watchdog stopped at the end of a run: bound the process's exit (see
        :mod:`teardown_guard`). A rank started by another rank's process gets a margin, so the
        launching rank's exit status is the one reported."""
        seconds = self.heartbeat.threshold(Phase.teardown)
        try:
            if self.coordinator.launcher_parent() is not None:
                seconds += 2 * LEAVE_WAIT_SECONDS
        except Exception:  # noqa: BLE001
            log.debug("launcher parent lookup failed", exc_info=True)
        code = self.config.exit_code if self.config.on_stall is StallAction.dump_and_exit else None
        guard_exit(self.dump_dir, self.rank, seconds, code, format_stacks, self._exit_fn)

    def on_exception(self, exception: BaseException) -> None:
        """Main thread, from ``on_exception``: dump this rank and ask the others; never raises."""
        text = f"{type(exception).__name__}: {exception}"
        if not self.config.dump_on_exception:
            return
        if isinstance(exception, (KeyboardInterrupt, SystemExit)):
            log.info("[rank %d] %s: no exception dump (send SIGUSR2 for an on-demand one)", self.rank, text)
            return
        locked = self._event_lock.acquire(timeout=STORE_PROBE_AFTER_SECONDS)
        # a busy watchdog (reconnecting to a dead store) or a lost listener: ask the store first
        if (not locked or not self.listening()) and not self._store_answers():
            if locked:
                self._event_lock.release()
            self._dump_without_store("exception", text, StoreUnavailable("the job's store refused a new connection"))
            return
        if not locked and not self._event_lock.acquire(timeout=self.config.collect_timeout_seconds + 10.0):
            log.warning("[rank %d] the watchdog is busy: no exception dump", self.rank)
            return
        event = None
        try:
            self._ensure_armed()
            event = self._open_incident()
            if event is not None:
                self.participation.open[event.number].raised = True  # no longer making progress
                log.warning("[rank %d] %s raised while %s, which this rank already dumped for, is open: no second "
                            "event", self.rank, text[:200], event.name)
            elif self._still_in_incident(f"raised {text[:200]}"):
                pass
            else:
                try:
                    event = self.coordinator.propose("exception")  # a concurrent event: joined, the exception in its dump
                except StoreUnavailable as error:  # its host died: the evidence stays on this disk
                    self._dump_without_store("exception", text, error)
                if event is not None:
                    self._take_part(event, exception=text)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] the exception dump failed", self.rank, exc_info=True)
        finally:
            self._event_lock.release()
        opened = self.participation.open.get(event.number) if event is not None else None
        if opened is not None and opened.exit_job and self.running:
            self._await_exit(event)

    def _open_incident(self) -> EventMeta | None:
        """The stall or exception event this rank took part in that is still open (its peers'
        failure and this rank's exception are one incident)."""
        for opened in self.participation.open.values():
            if opened.event.reason in ("stall", "exception"):
                return opened.event
        return None

    def _await_exit(self, event: EventMeta) -> None:
        """Main thread, after an exception with ``dump_and_exit``: the watchdog thread ends the
        process once the initiator says how (bounded: then the exception goes on as usual)."""
        deadline = self._clock() + scaled(self.config.collect_timeout_seconds + EXIT_WAIT_MARGIN_SECONDS,
                                          self.world_size)
        while event.number in self.participation.open and self._clock() < deadline and self.running:
            self._wakeup.wake()
            self._stop.wait(self.config.poll_interval_seconds)
        if self._exiting.is_set():  # the thread is leaving with the event's status: this exception must not win
            time.sleep(scaled(LEAVE_WAIT_SECONDS + PARENT_EXIT_WAIT_SECONDS + self.heartbeat.overrun_bar(),
                              self.world_size))


def _wait_for_reparenting(parent_pid: int, timeout_seconds: float, poll_seconds: float = 0.05) -> bool:
    """True once this process's parent is no longer ``parent_pid`` (it exited: the kernel gives
    its children to init or a subreaper at once, before it is reaped)."""
    deadline = time.monotonic() + timeout_seconds
    while os.getppid() == parent_pid:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_seconds)
    return True


def _hard_exit(code: int) -> None:
    """The main thread is blocked in C++: ``sys.exit`` from this thread would do nothing."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)
