"""One rank's part in a dump event, step by step, and what it does until the event's outcome.

Taking part (:meth:`EventParticipation.take_part`): write this rank's dump, announce it (with a
digest or the whole dump through the store), look for exited processes on this host, tell the
loggers; the initiator then gathers and summarizes. Evidence is written as early as possible
(stacks are freshest then), but nothing destructive happens yet.

Following (:meth:`EventParticipation.follow`, at every watchdog tick while an event is open):

- every rank joins the ``moved`` roster once its heartbeat moves past the one the event was about;
- a wanted rank (two-phase gather) sends its full dump when its bell rings;
- the initiator declares the event **recovered** when every rank that dumped has moved on: the
  summary, ``collection.json``, the log and the bells say so, the event no longer counts against
  ``max_dumps_per_run``, and each rank learns that a wait at that site ends (the consensus waits
  longer there next time);
- with ``dump_and_exit`` the initiator ends the job only once the hang is **confirmed**: no
  recovery within the learned step threshold since the heartbeat the event was about (an
  exception is confirmed at once). A rank obeys that exit order only once its own step has run
  for plain evidence of a hang (3x its slowest step, at least 2 s: the consensus rule), so an
  order planted in the store can never end a rank that is making progress; without any order
  it leaves alone only after its own step threshold and the collection have passed, or once
  its own step threshold has passed where no order can come any more (the initiator's process
  is gone, or the job's store refuses connections: its host process is gone).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lightning_ncclx.config import HANG_KINDS, StallAction, WatchdogConfig, exit_code_for
from lightning_ncclx.dump.digest import make_digest
from lightning_ncclx.dump.writer import host_name, write_rank_dump
from lightning_ncclx.events.connection import StoreServerGone, StoreUnavailable
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.gather import CollectionResult, record_recovery
from lightning_ncclx.events.keys import safe_host
from lightning_ncclx.events.wire import Announcement, EventMeta, Outcome
from lightning_ncclx.log_setup import RepeatedFailure
from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase
from lightning_ncclx.watchdog.initiator_pulse import PULSE_STALE_SECONDS, InitiatorPulse, PulseWatch, check_gap

log = logging.getLogger(__name__)

EXIT_WAIT_MARGIN_SECONDS = 60.0
"""Beyond the confirmation window and the collection, how long a rank waits for an initiator that
never says how the event ended before it decides alone (it must be stuck past its own threshold)."""
RANKS_PER_EXTRA_SECOND = 256
"""Waits grow with the job: one more second per this many ranks (the store serves them in turn)."""
MAX_FOLLOW_GAP_SECONDS = 30.0
INITIATOR_CHECK_SECONDS = 1.0
"""How often a rank waiting for an exit order looks whether the initiator's process on its host is
gone (``/proc``, no store call)."""


def scaled(seconds: float, world_size: int) -> float:
    """``seconds`` plus one per ``RANKS_PER_EXTRA_SECOND`` ranks."""
    return seconds + world_size / RANKS_PER_EXTRA_SECOND


@dataclass
class OpenEvent:
    """An event this rank dumped for, followed until its outcome."""

    event: EventMeta
    initiator: bool
    beat_seq: int
    beat_time: float
    """The heartbeat the event was about (seq and monotonic time)."""
    exit_job: bool
    files: list[Path]
    site: str | None = None
    """Where this rank's main thread was (for the consensus to learn from a recovery)."""
    raised: bool = False
    """This rank raised the exception the event is about (it is not making progress)."""
    awaiting_want: bool = False
    moved_reported: bool = False
    result: CollectionResult | None = None
    expected_movers: int = 0
    confirm_at: float = math.inf
    give_up_at: float = math.inf
    alert_at: float = math.inf
    """When the initiator sends the trigger alert: once the hang is confirmed (never for a
    wait that recovers before)."""
    alerted: bool = False
    exit_order: Outcome | None = None
    counted: bool = False
    """The event counts against this rank's ``max_dumps_per_run`` (this rank detected the stall)."""
    next_check: float = 0.0
    checks: int = 0
    initiator_gone: bool = False
    """The initiator's process is known gone: the outcome it wrote (if any) is read without waiting
    for its bell, and without one this rank decides alone once it is stuck past its own threshold."""
    read_after_gone: bool = False
    store_gone: str | None = None
    """Why no word on the event can come any more: nothing listens at the job's store (its host
    process is gone). Like a gone initiator, this rank then decides alone once it is stuck past
    its own threshold."""
    next_gone_check: float = 0.0
    pulse: PulseWatch = field(default_factory=PulseWatch)
    """The initiator's sign of life as this rank last read it (:mod:`initiator_pulse`)."""
    notes: list[str] = field(default_factory=list)

    @property
    def may_recover(self) -> bool:
        """Only a stall can end by itself (an exception is a confirmed failure; an on-demand dump
        is no alarm)."""
        return self.event.reason == "stall"

    @property
    def pending(self) -> bool:
        """Something is still to come: a recovery, an exit order, or the initiator's want."""
        return self.may_recover or self.exit_job or self.awaiting_want


class Runtime(Protocol):
    """What the event steps use of the rank's watchdog (:class:`~lightning_ncclx.watchdog.runtime.WatchdogRuntime`)."""

    rank: int
    world_size: int
    config: WatchdogConfig
    coordinator: EventCoordinator
    heartbeat: Heartbeat
    dump_dir: Path
    stack_traces: bool
    cuda_device: int | None
    detection: dict | None
    stall_events: int
    events_taken_part: int

    def clock(self) -> float: ...
    def listening(self) -> bool: ...
    def allowed_exit_codes(self) -> set[int]: ...
    def site_now(self) -> str | None: ...
    def learn_recovery(self, site: str | None, seconds: float) -> None: ...
    def native_stacks_disarm(self) -> None: ...
    def note_on_demand(self) -> None: ...
    def write_side_files(self, folder: Path) -> None: ...
    def notify_dumped(self, reason: str) -> None: ...
    def summarize(self, event: EventMeta, folder: Path) -> CollectionResult: ...
    def report_kind(self, event: EventMeta, kind: str | None, advice: dict[str, Any] | None) -> None: ...
    def leave(self, event: EventMeta) -> None: ...
    def exit_job(self, event: EventMeta, exit_code: int) -> None: ...
    def alert(self, action: str, opened: "OpenEvent", *, exit_code: int | None = None,
              lasted_seconds: float = 0.0) -> None: ...
    def take_over_alerts(self, opened: "OpenEvent") -> None: ...
    def release_alert_claim(self, event: EventMeta) -> None: ...


class EventParticipation:
    """The event steps of one rank's watchdog; state lives here, the runtime calls in."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.open: dict[int, OpenEvent] = {}
        self.recovered_events = 0
        self.pulse: InitiatorPulse | None = None
        self._starting: EventMeta | None = None
        """The event this rank initiates and is dumping for, before it is open."""
        self._follow_failures = RepeatedFailure()

    # ------------------------------------------------------------------ taking part
    def take_part(self, event: EventMeta, exception: str | None = None, *,
                  detected: bool = False) -> CollectionResult | None:
        """Dump this rank into the event's folder; the initiator then collects and summarizes.
        ``detected``: this rank started the event (only then does a stall count against its
        ``max_dumps_per_run``). Caller holds the runtime's event lock."""
        rt = self.rt
        initiator = event.initiator == rt.rank
        beat = rt.heartbeat.last
        rt.native_stacks_disarm()
        exit_job = event.reason in ("stall", "exception") and rt.config.on_stall is StallAction.dump_and_exit
        if initiator and exit_job:
            self._starting = event  # beat before the own dump: a count never seen means a dead initiator
            self._start_pulse()
        try:
            counted = self._count(event, detected)
            folder = rt.dump_dir / event.name
            files = self._write_dump(event, folder, initiator, exception)
            two_phase = rt.config.two_phase_gather(rt.world_size)
            self._announce(event, files, folder, initiator, two_phase)
            self._check_local_peers(event)
            rt.notify_dumped(event.reason)
            opened = OpenEvent(event, initiator, beat.seq, beat.time, exit_job, files, site=rt.site_now(),
                               raised=exception is not None, awaiting_want=two_phase and not initiator, counted=counted)
            if opened.pending:
                self.open[event.number] = opened
                if initiator:
                    self._start_pulse()
        finally:
            self._starting = None
        opened.give_up_at = self._give_up_at(opened)
        if initiator:
            opened.result = rt.summarize(event, folder)
            self._close(opened)
            self._arm_confirmation(opened, exception is not None)
            self._arm_alert(opened)
        self.follow(force=not rt.listening())  # a listening rank hears want and outcome ring: no read now
        return opened.result

    def _start_pulse(self) -> None:
        if self.pulse is None:
            self.pulse = InitiatorPulse(self.rt.coordinator, self._decided_here)
        self.pulse.ensure_started()

    def _decided_here(self) -> list[EventMeta]:
        """The open events this rank is the initiator of, and the one it is taking part in now
        (read from the pulse's thread)."""
        events = [opened.event for opened in list(self.open.values()) if opened.initiator]
        starting = self._starting
        if starting is not None and all(event.number != starting.number for event in events):
            events.append(starting)
        return events

    def stop_pulse(self) -> None:
        if self.pulse is not None:
            self.pulse.stop()

    def _count(self, event: EventMeta, detected: bool) -> bool:
        """True when the event counts against ``max_dumps_per_run``."""
        rt = self.rt
        if event.reason == "on_demand":
            rt.note_on_demand()
        if event.reason != "stall":
            return False
        rt.heartbeat.mark_reported()  # this stall is being handled: no second alarm for it
        if detected:
            rt.stall_events += 1
        return detected

    def _write_dump(self, event: EventMeta, folder: Path, initiator: bool, exception: str | None) -> list[Path]:
        rt = self.rt
        progress = dict(rt.heartbeat.progress(), stall_events=rt.stall_events)
        if initiator and event.reason == "stall":
            progress["detection"] = rt.detection or {"by": "step_threshold"}
        files = write_rank_dump(
            folder, event=event.name, reason=event.reason if initiator else "peer_request",
            initiator_rank=event.initiator, progress=progress, stack_traces=rt.stack_traces,
            exception=exception, cuda_device=rt.cuda_device,
        )
        if files:
            log.warning("[rank %d] %s (%s, initiator rank %d): wrote %d file(s) to %s", rt.rank, event.name,
                        event.reason, event.initiator, len(files), folder)
        else:
            log.error("[rank %d] %s (%s, initiator rank %d): no file of this rank's dump could be written to %s "
                      "(see the errors above): check flight_recorder.dump_dir", rt.rank, event.name, event.reason,
                      event.initiator, folder)
        rt.write_side_files(folder)
        rt.events_taken_part += 1
        return files

    def _announce(self, event: EventMeta, files: list[Path], folder: Path, initiator: bool, two_phase: bool) -> None:
        rt = self.rt
        digest = None
        upload: list[Path] | None = None
        if rt.config.gather_through_store and not initiator:
            if two_phase:
                try:
                    digest = make_digest(files)
                except Exception:  # noqa: BLE001 - the initiator then names this rank's dump as kept on its host
                    log.warning("[rank %d] making the digest failed", rt.rank, exc_info=True)
            else:
                upload = files
        announcement = Announcement(rt.rank, safe_host(host_name()), tuple(p.name for p in files), str(folder),
                                    digest)
        try:
            rt.coordinator.announce(event, announcement, upload)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] announcing the dump through the store failed", rt.rank, exc_info=True)

    def _check_local_peers(self, event: EventMeta) -> None:
        rt = self.rt
        try:
            gone = rt.coordinator.check_local_peers(event)
            if gone:
                log.warning("[rank %d] %s: the process of rank(s) %s on this host is gone", rt.rank, event.name,
                            sorted(gone))
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] checking this host's other ranks failed", rt.rank, exc_info=True)

    def _close(self, opened: OpenEvent) -> None:
        rt, result = self.rt, opened.result
        if result is None:
            return
        try:
            rt.coordinator.close(opened.event, result.announced, result.blobs_from)
            log.info("[rank %d] %s is closed: a rank that comes to it later keeps its dump to itself", rt.rank,
                     opened.event.name)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] clearing %s's store keys failed", rt.rank, opened.event.name, exc_info=True)
        opened.expected_movers = len([r for r in result.dumped_ranks if r not in result.gone_ranks])

    def _confirmation_bar(self) -> float:
        """How old a heartbeat must be before a hang counts as confirmed: the learned step
        threshold (the same bar the step threshold alone would have needed)."""
        return self.rt.heartbeat.threshold(Phase.train_step)

    def _arm_confirmation(self, opened: OpenEvent, raised: bool) -> None:
        if not opened.exit_job:
            return
        opened.confirm_at = -math.inf if raised else opened.beat_time + self._confirmation_bar()

    def _arm_alert(self, opened: OpenEvent) -> None:
        """A stall alerts once its heartbeat has not moved for ``ncclx.alerts.confirm_seconds`` (at
        the latest at the ``dump_and_exit`` bar); an exception at once; an on-demand dump never."""
        if opened.event.reason == "exception":
            self._send_trigger(opened, None if not opened.exit_job else self._exit_code(opened))
        elif opened.event.reason == "stall":
            notifier = self.rt.alerts
            page_after = notifier.config.confirm_seconds if notifier is not None else math.inf
            opened.alert_at = opened.beat_time + min(page_after, self._confirmation_bar())

    def _exit_code(self, opened: OpenEvent) -> int:
        return exit_code_for(opened.result.hang_kind if opened.result is not None else None, self.rt.config)

    def _send_trigger(self, opened: OpenEvent, exit_code: int | None) -> None:
        if not opened.alerted:
            opened.alerted = True
            self.rt.alert("trigger", opened, exit_code=exit_code)

    def _give_up_at(self, opened: OpenEvent) -> float:
        config = self.rt.config
        wait = self._confirmation_bar() + config.collect_timeout_seconds + EXIT_WAIT_MARGIN_SECONDS
        return opened.beat_time + scaled(wait, self.rt.world_size)

    # ------------------------------------------------------------------ following
    def follow(self, *, force: bool = False, rung: bool = False) -> None:
        """One step for every open event; ``rung``: this rank's bell rang since the last call."""
        for opened in list(self.open.values()):
            if not opened.initiator:  # before the store: the sender may have been the store's host
                try:
                    self.rt.take_over_alerts(opened)
                except Exception:  # noqa: BLE001
                    log.warning("[rank %d] checking %s's alerts failed", self.rt.rank, opened.event.name,
                                exc_info=True)
            try:
                self._follow_one(opened, force or rung)
                self._follow_failures.succeeded()
            except Exception:  # noqa: BLE001 - the store may be gone; try again at the next tick
                self._follow_failures.failed(log, "[rank %d] following %s failed", self.rt.rank, opened.event.name)

    def _due(self, opened: OpenEvent, rung: bool) -> bool:
        """Read the event's keys now? At a ring; without a listening doorbell, with a growing gap."""
        now = self.rt.clock()
        if rung or (not self.rt.listening() and now >= opened.next_check) or opened.initiator:
            opened.checks += 1
            opened.next_check = now + min(MAX_FOLLOW_GAP_SECONDS, self.rt.config.poll_interval_seconds *
                                          2 ** min(opened.checks, 6))
            return True
        return False

    def _follow_one(self, opened: OpenEvent, rung: bool) -> None:
        rt = self.rt
        beat = rt.heartbeat.last
        if rt.clock() >= opened.give_up_at and not (opened.exit_job and (opened.raised or beat.seq == opened.beat_seq)):
            self._expire(opened, "neither recovered nor confirmed within its window")  # a stuck rank's exit is below
            return
        if (opened.may_recover and not opened.moved_reported and beat.seq != opened.beat_seq
                and beat.phase is not Phase.idle):
            rt.coordinator.join_roster(opened.event, "moved")
            opened.moved_reported = True
        if opened.initiator:
            self._decide(opened)
            return
        due = self._due(opened, rung)
        if opened.exit_job and opened.exit_order is None and rt.clock() < opened.give_up_at:
            self._initiator_gone(opened, read_store=False)
        waiting_to_leave = opened.exit_order is not None or (opened.exit_job and (
            rt.clock() >= opened.give_up_at or opened.store_gone is not None or opened.initiator_gone))
        if not due and not waiting_to_leave:
            return
        try:
            if not self._read_event(opened, due):
                return
        except StoreServerGone as error:
            if not opened.exit_job:
                raise
            self._note_store_gone(opened, error)
        self._maybe_exit(opened)

    def _read_event(self, opened: OpenEvent, due: bool) -> bool:
        """Serve the initiator's want and read the outcome; False when the event is over here."""
        rt = self.rt
        if opened.awaiting_want:
            self._serve_want(opened)
        if not opened.pending:
            self.open.pop(opened.event.number, None)
            return False
        read_already = opened.initiator_gone and opened.read_after_gone  # a dead initiator writes nothing more
        if opened.exit_order is None and opened.store_gone is None and (due or not read_already):
            opened.read_after_gone = opened.initiator_gone
            outcome = rt.coordinator.outcome(opened.event, rt.allowed_exit_codes(), HANG_KINDS)
            if outcome is not None and outcome.recovered:
                if opened.may_recover and opened.moved_reported:
                    self._recovered(opened, outcome.lasted_seconds)
                    return False
                rt.coordinator.refuse(f"{opened.event.name}: said to have recovered, but this rank has not moved on"
                                      if opened.may_recover else f"{opened.event.name}: a recovery of a "
                                      f"{opened.event.reason} event")
                outcome = None
            opened.exit_order = outcome
            if outcome is None and opened.exit_job and due:
                self._initiator_gone(opened, read_store=True)
        return True

    def _note_store_gone(self, opened: OpenEvent, error: StoreServerGone) -> None:
        if opened.store_gone is None:
            opened.store_gone = str(error).splitlines()[0][:200] if str(error) else "connection refused"
            opened.awaiting_want = False  # nobody can ask for this rank's dump any more
            log.warning("[rank %d] %s: the job's store is gone (%s): no word on how the event ends can come; this "
                        "rank leaves alone once its own step has been stuck past its threshold", self.rt.rank,
                        opened.event.name, opened.store_gone)

    def _initiator_gone(self, opened: OpenEvent, *, read_store: bool) -> bool:
        """Whether the initiator's process is known gone: on this host through ``/proc`` (every
        ``INITIATOR_CHECK_SECONDS``), or, with ``read_store``, as the event's gone ranks say (a
        rank of its host reported it), or, on any host, from its sign of life that stopped
        (:meth:`_pulse_stopped`). The first rank to see it locally tells every rank."""
        if opened.initiator_gone:
            return True
        rt, rank = self.rt, opened.event.initiator
        if not read_store and rt.clock() < opened.next_gone_check:
            return False
        opened.next_gone_check = rt.clock() + INITIATOR_CHECK_SECONDS
        try:
            here = rt.coordinator.local_process_gone(rank)
            if here or (read_store and rank in rt.coordinator.gone_ranks(opened.event)):
                opened.initiator_gone = True
                log.warning("[rank %d] %s: the process of the summarizing rank %d is gone: reading how the event "
                            "ended now instead of waiting for its word", rt.rank, opened.event.name, rank)
                if here:
                    rt.coordinator.announce_initiator_gone(opened.event)
            elif self._pulse_stopped(opened):
                opened.initiator_gone = True
                log.warning("[rank %d] %s: the summarizing rank %d has given no sign of life for %.0f s (its host's "
                            "/proc is not this rank's to read): reading how the event ended now instead of waiting "
                            "for its word", rt.rank, opened.event.name, rank, opened.pulse.stopped_for(rt.clock()))
        except StoreServerGone as error:
            if opened.exit_job:
                self._note_store_gone(opened, error)
            else:
                log.debug("checking the initiator's process: the store is gone", exc_info=True)
        except Exception:  # noqa: BLE001 - without liveness, wait for the initiator as before
            log.debug("checking the initiator's process failed", exc_info=True)
        return opened.initiator_gone

    def _pulse_stopped(self, opened: OpenEvent) -> bool:
        """The initiator's count has not changed for ``PULSE_STALE_SECONDS`` (scaled). Read only
        while this rank would leave on its own evidence anyway (its step stuck past its bar, no
        exit order yet), at most every :func:`check_gap` seconds: a rank that moves never reads it."""
        rt = self.rt
        now, beat = rt.clock(), rt.heartbeat.last
        stuck = opened.raised or (beat.seq == opened.beat_seq and now - beat.time >= self._confirmation_bar())
        if not opened.exit_job or opened.exit_order is not None or not stuck or now < opened.pulse.next_read:
            return False
        opened.pulse.next_read = now + check_gap(rt.world_size)
        opened.pulse.note(rt.coordinator.pulse(opened.event), now)
        return opened.pulse.stopped_for(now) >= scaled(PULSE_STALE_SECONDS, rt.world_size)

    def _serve_want(self, opened: OpenEvent) -> None:
        rt = self.rt
        wanted = rt.coordinator.wanted(opened.event)
        if wanted is None:
            if rt.coordinator.is_closed(opened.event):
                opened.awaiting_want = False  # summarized without asking: nothing to send
            return
        opened.awaiting_want = False
        if rt.rank in wanted and opened.files:
            if rt.coordinator.upload_full(opened.event, opened.files):
                log.info("[rank %d] %s: the summarizing rank asked for this rank's full dump: sent", rt.rank,
                         opened.event.name)

    def _decide(self, opened: OpenEvent) -> None:
        rt = self.rt
        if not opened.pending:
            self.open.pop(opened.event.number, None)
            return
        if (opened.may_recover and opened.moved_reported and opened.expected_movers
                and len(rt.coordinator.roster(opened.event, "moved")) >= opened.expected_movers):
            lasted = max(0.0, rt.clock() - opened.beat_time)
            try:
                rt.coordinator.set_outcome(opened.event, Outcome(recovered=True, lasted_seconds=lasted))
            except Exception:  # noqa: BLE001 - the others learn nothing; this rank still records it
                log.warning("[rank %d] announcing the recovery of %s failed", rt.rank, opened.event.name,
                            exc_info=True)
            self._recovered(opened, lasted)
            return
        if rt.clock() >= opened.alert_at and rt.heartbeat.last.seq == opened.beat_seq:
            self._send_trigger(opened, self._exit_code(opened) if opened.exit_job else None)
        if not opened.exit_job or rt.clock() < opened.confirm_at:
            return
        if not opened.raised and not self._stuck_in_event_step(opened):
            return
        result = opened.result
        kind = result.hang_kind if result is not None else None
        code = exit_code_for(kind, rt.config)
        self._send_trigger(opened, code)
        try:
            rt.coordinator.set_outcome(opened.event, Outcome(exit=True, code=code, kind=kind,
                                                             advice=result.restart_advice if result else {}))
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] announcing the end of the job failed", rt.rank, exc_info=True)
        del self.open[opened.event.number]
        log.error("[rank %d] %s: no rank moved on within %.1f s of the heartbeat it was about: the hang is "
                  "confirmed", rt.rank, opened.event.name, self._confirmation_bar())
        if opened.event.reason == "exception":
            rt.leave(opened.event)  # the exception ends this rank's fit itself, after the others' exit
        else:
            rt.exit_job(opened.event, code)

    def _stuck_in_event_step(self, opened: OpenEvent) -> bool:
        """The initiator's own evidence before it ends the job: its heartbeat is still the one the
        event was about, for at least the plain-evidence bar (as every other rank's, see
        :meth:`_maybe_exit`). An event it has moved past is not confirmed whatever the store says
        (a roster another client spoiled cannot end a job that makes progress): it expires."""
        rt = self.rt
        beat = rt.heartbeat.last
        if beat.seq != opened.beat_seq:
            self._expire(opened, "this rank's heartbeat moved past the one it was about")
            return False
        return rt.clock() - beat.time >= rt.heartbeat.overrun_bar()

    def _expire(self, opened: OpenEvent, why: str) -> None:
        """No longer followed: the event neither recovered nor was confirmed within its window."""
        self.open.pop(opened.event.number, None)
        if opened.initiator and not opened.alerted:
            self.rt.release_alert_claim(opened.event)
        log.warning("[rank %d] %s: not confirmed as a hang (%s); no longer followed", self.rt.rank,
                    opened.event.name, why)

    def _recovered(self, opened: OpenEvent, lasted: float | None) -> None:
        rt = self.rt
        self.open.pop(opened.event.number, None)
        if opened.initiator and not opened.alerted:
            rt.release_alert_claim(opened.event)
        self.recovered_events += 1
        if opened.counted:
            rt.stall_events = max(0, rt.stall_events - 1)
        if opened.event.reason == "stall":
            rt.heartbeat.forget_stall(opened.beat_seq)
        seconds = lasted if lasted is not None else max(0.0, rt.clock() - opened.beat_time)
        log.warning("[rank %d] %s recovered after %.1f s: not a hang", rt.rank, opened.event.name, seconds)
        if opened.result is not None:
            record_recovery(opened.result, {"recovered": True, "lasted_seconds": round(seconds, 3),
                                            "ranks_moved_on": opened.expected_movers})
        rt.learn_recovery(opened.site, seconds)
        if opened.alerted:
            rt.alert("resolve", opened, lasted_seconds=seconds)

    def _maybe_exit(self, opened: OpenEvent) -> None:
        """Leave on the initiator's order (or alone, when it never answers) once this rank's own
        heartbeat is at least its step threshold old: never while it makes progress."""
        rt = self.rt
        order = opened.exit_order
        beat = rt.heartbeat.last
        if not opened.exit_job:
            return  # ``dump`` never ends the job: an exit order here was not written by an initiator
        stuck_for = rt.clock() - beat.time
        bar = rt.heartbeat.overrun_bar() if order is not None else self._confirmation_bar()
        if not opened.raised and (beat.seq != opened.beat_seq or stuck_for < bar):
            if order is not None and not opened.notes:
                opened.notes.append("deferred")
                log.warning("[rank %d] %s: the job is to end (exit %s), but this rank's step has run %.1f s, under "
                            "%.1f s (%.0fx its slowest step): leaving once it is stuck that long", rt.rank,
                            opened.event.name, order.code, stuck_for, bar, rt.config.consensus.multiplier)
            return
        if order is None:
            if rt.clock() < opened.give_up_at and not opened.initiator_gone and opened.store_gone is None:
                return
            code = rt.config.exit_code
            if opened.store_gone is not None:
                log.error("[rank %d] %s: the job's store is gone, so no word on how the event ended can come; this "
                          "rank is stuck for %.1f s: leaving with %d", rt.rank, opened.event.name, stuck_for, code)
            elif opened.initiator_gone:
                log.error("[rank %d] %s: the summarizing rank %d is gone without saying how the event ended; this "
                          "rank is stuck for %.1f s: leaving with %d", rt.rank, opened.event.name,
                          opened.event.initiator, stuck_for, code)
            else:
                log.error("[rank %d] %s: the summarizing rank never said how the event ended; this rank is stuck "
                          "for %.1f s: leaving with %d", rt.rank, opened.event.name, stuck_for, code)
        else:
            try:
                latest = rt.coordinator.outcome(opened.event, rt.allowed_exit_codes(), HANG_KINDS)
            except StoreUnavailable:
                latest = None  # the order already read stands
            order = latest if latest is not None and latest.exit else order  # the initiator's last word
            code = int(order.code if order.code is not None else rt.config.exit_code)
            rt.report_kind(opened.event, order.kind, order.advice)
        del self.open[opened.event.number]
        rt.exit_job(opened.event, code)


__all__ = ["EventParticipation", "OpenEvent", "scaled"]
