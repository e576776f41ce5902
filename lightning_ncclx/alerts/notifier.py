"""The alerts of one rank's watchdog: a trigger once an event is confirmed as a hang, a resolve
when a triggered event recovers. Only the rank that wrote the summary calls it, and the alert
file is claimed (created exclusively) before sending: one alert per event and action.

A sender SIGKILLed while sending leaves its sinks ``pending`` in the file, each naming it as the
sender; another rank that follows the event on the same host sends them instead
(:meth:`AlertNotifier.take_over`), once its process is gone and after claiming the next
takeover generation exclusively: one rank takes over, and never while the sender lives.

Across hosts the job's store holds the claim (:mod:`~lightning_ncclx.alerts.claim`): the
summarizing rank arms it with the trigger document once the summary is written
(:meth:`AlertNotifier.arm`) and marks it as it sends; a watcher on any host whose own heartbeat
confirms the event sends that document once the claim stayed unchanged past the holder's
deadline (:meth:`AlertNotifier.watch_claim`); a takeover on the sender's host claims it there
too. One process of the job sends each trigger.

Delivery runs on a daemon thread; :meth:`AlertNotifier.drain` lets a rank about to exit wait for
it, at most until the alert's deadline (``ncclx.alerts.deadline_seconds``)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.alerts.claim import BEAT_SECONDS, TAKEOVER_MARGIN_SECONDS, ClaimBoard, ClaimRecord, watchers
from lightning_ncclx.alerts.delivery import Policy, deliver
from lightning_ncclx.alerts.message import (
    dedup_key, read_summary, resolve_document, straggler_document, trigger_document,
)
from lightning_ncclx.alerts.outbox import (
    ACTIONS, BadAlertFile, alert_path, claim, read_alert, takeover_claim_path, write_alert,
)
from lightning_ncclx.alerts.sender import MAX_GENERATION, generation_of, sender_gone, sender_record
from lightning_ncclx.alerts.sinks import CommandSink, PagerDutySink, Sink, WebhookSink
from lightning_ncclx.config import AlertsConfig
from lightning_ncclx.events.connection import StoreServerGone, StoreUnavailable
from lightning_ncclx.log_setup import RepeatedFailure

log = logging.getLogger(__name__)


def sinks_of(config: AlertsConfig) -> list[Sink]:
    sinks: list[Sink] = []
    if config.webhook.url_env:
        sinks.append(WebhookSink(config.webhook.url_env))
    if config.pagerduty.routing_key_env:
        sinks.append(PagerDutySink(config.pagerduty.routing_key_env, config.pagerduty.endpoint,
                                   config.pagerduty.severity))
    if config.command:
        sinks.append(CommandSink(config.command))
    return sinks


def policy_of(config: AlertsConfig) -> Policy:
    return Policy(config.attempt_timeout_seconds, config.attempts, config.deadline_seconds)


class AlertNotifier:
    """Trigger and resolve the alerts of this rank's events; never raises into the watchdog."""

    def __init__(self, config: AlertsConfig, *, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.sinks = sinks_of(config)
        self.policy = policy_of(config)
        self._threads: list[tuple[threading.Thread, float]] = []
        self._triggers: dict[str, threading.Thread] = {}
        """Event folder -> the thread sending its trigger: a resolve goes out only after it."""
        self._sending: set[str] = set()
        """Alert files this process sends (its own, or taken over)."""
        self._last_straggler: float | None = None
        """When the last straggler warning went out (monotonic): the rate limit's clock."""
        self.claims: ClaimBoard | None = None
        """The job-wide claims in the job's store (:meth:`attach_claims`); None: this host only."""
        self._claimed: set[int] = set()
        """Events whose trigger this rank claimed in place of a holder that is gone."""
        self._watching: dict[int, tuple[dict[str, Any], Callable[[], bool]]] = {}
        """Event number -> the arguments of :meth:`watch_claim` and whether it is still confirmed."""
        self._watch_failures = RepeatedFailure()
        self._unanswered_since: dict[int, float] = {}
        """Event number -> when this rank's read of its claim first failed without a refusal."""
        self._beater: threading.Thread | None = None
        self._beater_lock = threading.Lock()
        self._beat_failures = RepeatedFailure()

    def attach_claims(self, board: ClaimBoard) -> None:
        board.hold_seconds = self.takeover_hold_seconds
        self.claims = board

    def _keep_claims_alive(self) -> None:
        """Beat the claims this rank holds (:meth:`ClaimBoard.beat`) from a daemon thread that
        ends once none is held: nothing runs between events."""
        board = self.claims
        if board is None:
            return
        with self._beater_lock:
            if self._beater is None:
                self._beater = threading.Thread(target=self._beat_claims, args=(board,), name="ncclx-alert-claim",
                                                daemon=True)
                self._beater.start()

    def _beat_claims(self, board: ClaimBoard) -> None:
        while True:
            time.sleep(BEAT_SECONDS)
            try:
                board.beat()
                self._beat_failures.succeeded()
            except Exception:  # noqa: BLE001 - the store's host may be gone; beating goes on until the hold ends
                self._beat_failures.failed(log, "[rank %d] renewing the alert claim failed", self.rank)
            with self._beater_lock:
                if not board.holding():
                    self._beater = None
                    return

    def release_claim(self, number: int) -> None:
        """The summarizing rank sends no trigger for event ``number`` (it recovered or expired)."""
        if self.claims is not None:
            self.claims.release(number)

    @property
    def takeover_hold_seconds(self) -> float:
        """How long a claim stays unchanged before a watcher takes it over: a live holder
        finishes its delivery within the deadline."""
        return self.policy.deadline_seconds + TAKEOVER_MARGIN_SECONDS

    def arm(self, folder: Path, *, number: int, event: str, reason: str, exit_code: int | None,
            claim_within_seconds: float, opened: float | None = None) -> None:
        """The summarizing rank, once the summary is written: the trigger it would send, in the
        store, for a watcher to send should this process be gone by then."""
        if self.claims is None:
            return
        try:
            summary = read_summary(folder) or {}
            document = trigger_document(folder, summary, event=event, reason=reason, exit_code=exit_code,
                                        dedup_key=dedup_key(folder, summary, event, opened))
            self.claims.arm(number, document, claim_within_seconds)
            self._keep_claims_alive()
        except Exception:  # noqa: BLE001 - the alert is still sent by this rank; only a takeover lacks it
            log.warning("%s: arming the job-wide alert claim failed", event, exc_info=True)

    def trigger(self, folder: Path, *, event: str, reason: str, exit_code: int | None,
                number: int | None = None, opened: float | None = None) -> None:
        """Send the trigger of an event this rank summarized (once per event folder);
        ``opened``: the event meta's (see :func:`~lightning_ncclx.alerts.message.dedup_key`)."""
        try:
            path = alert_path(folder, "trigger")
            if not claim(path):
                log.info("%s: an alert was already sent for this event (%s)", event, path)
                return
            summary = read_summary(folder) or {}
            document = trigger_document(folder, summary, event=event, reason=reason, exit_code=exit_code,
                                        dedup_key=dedup_key(folder, summary, event, opened))
            held = self._hold(number, document)
            self._triggers[str(folder)] = self._start(path, document, on_done=self._finisher(number, held))
        except Exception:  # noqa: BLE001
            log.warning("%s: the alert could not be prepared", event, exc_info=True)

    def resolve(self, folder: Path, *, event: str, lasted_seconds: float) -> None:
        try:
            trigger_path = alert_path(folder, "trigger")
            try:
                trigger, _ = read_alert(trigger_path)
            except BadAlertFile:
                log.info("%s recovered without a trigger alert sent: no resolve", event)
                return
            path = alert_path(folder, "resolve")
            if not claim(path):
                return
            self._start(path, resolve_document(trigger, lasted_seconds), after=self._triggers.get(str(folder)))
        except Exception:  # noqa: BLE001
            log.warning("%s: the resolve alert could not be prepared", event, exc_info=True)

    def straggler(self, folder: Path, episode: dict[str, Any]) -> bool:
        """A straggler warning for ``episode`` (a straggler episode's JSON), at most one per
        ``straggler_min_interval_seconds`` for this process; False when none was sent."""
        try:
            now = time.monotonic()
            since = None if self._last_straggler is None else now - self._last_straggler
            if since is not None and since < self.config.straggler_min_interval_seconds:
                log.info("straggler warning for rank %s not sent: %.0f s after the last one (at most one per %g s, "
                         "ncclx.alerts.straggler_min_interval_seconds)", episode.get("rank"), since,
                         self.config.straggler_min_interval_seconds)
                return False
            folder.mkdir(parents=True, exist_ok=True)
            document = straggler_document(folder, episode)
            path = folder / f"alert-{document['event']}.json"
            if not claim(path):
                return False
            self._last_straggler = now
            self._start(path, document)
            return True
        except Exception:  # noqa: BLE001
            log.warning("the straggler warning could not be prepared", exc_info=True)
            return False

    def _hold(self, number: int | None, document: dict[str, Any]) -> ClaimRecord | None:
        if self.claims is None or number is None:
            return None
        try:
            held = self.claims.hold(number, document)
            self._keep_claims_alive()
            return held
        except Exception:  # noqa: BLE001 - sent all the same: the store only serves a takeover
            log.warning("%s: marking the job-wide alert claim failed", document.get("event"), exc_info=True)
            return None

    def _finisher(self, number: int | None, held: ClaimRecord | None) -> Callable[[], None] | None:
        board = self.claims
        if board is None or number is None or held is None:
            return None
        return lambda: board.finish(number, held)

    def watch_claim(self, folder: Path, *, number: int, event: str, reason: str, initiator: int,
                    confirmed_at: float, still_confirmed: Callable[[], bool] = lambda: True,
                    read_now: bool = True, initiator_alone: bool = False, opened: float | None = None,
                    initiator_host: tuple[int, ...] | None = None, on_store_host: bool = True) -> bool:
        """A rank that follows an event its own heartbeat confirmed (at ``confirmed_at``,
        monotonic): send its trigger when the rank that holds the job-wide claim is gone (see
        :mod:`~lightning_ncclx.alerts.claim`); True when this rank took it over. Never raises.
        ``still_confirmed``: False once this rank moved past the event (:meth:`settle_claims`);
        ``read_now`` False: only noted, for :meth:`settle_claims` (not confirmed here yet: an exit
        order may end this process before). ``initiator_alone``: the event's meta says its
        summarizing rank ran alone on the host that serves the job's store (its own process or its
        launcher agent serves it); once that store is gone (a
        refused connection), the first of the event's watchers sends the trigger at once: the
        summarizing rank is gone with it, no claim can be made, and no rank of its host can take
        the alert over. ``initiator_host``: where the meta says the summarizing rank ran on the
        store's host, the other ranks registered there (None: it did not); ``on_store_host``:
        this rank runs there too. A store that answers nothing at all (no refusal: its host is
        lost, or cut off) for the takeover hold, while this rank's heartbeat confirms the hang,
        is taken as the loss of that host and every rank on it: the first watcher that the meta
        does not place there sends the trigger."""
        board = self.claims
        if board is None or number in self._claimed or self.rank not in watchers(initiator, board.world_size):
            return False
        self._watching[number] = (dict(folder=folder, number=number, event=event, reason=reason, initiator=initiator,
                                       confirmed_at=confirmed_at, initiator_alone=initiator_alone, opened=opened,
                                       initiator_host=initiator_host, on_store_host=on_store_host),
                                  still_confirmed)
        path = alert_path(folder, "trigger")
        if str(path) in self._sending or not read_now:
            return False
        try:
            held = board.watch(number, event, confirmed_at, self.takeover_hold_seconds,
                               lambda: self._fallback_document(folder, event, reason, initiator, opened))
            self._watch_failures.succeeded()
            self._unanswered_since.pop(number, None)
        except StoreServerGone:
            if not initiator_alone or self.rank != min(watchers(initiator, board.world_size)) \
                    or board.finished(number):
                self._watch_failures.failed(log, "[rank %d] watching the alert claim of %s failed", self.rank, event)
                return False
            return self._send_without_store(folder, number, event, reason, initiator, opened)
        except StoreUnavailable:
            if self._store_host_lost(number, initiator, confirmed_at, initiator_host, on_store_host):
                return self._send_without_store(folder, number, event, reason, initiator, opened,
                                                host_lost=initiator_host or ())
            self._watch_failures.failed(log, "[rank %d] watching the alert claim of %s failed", self.rank, event)
            return False
        except Exception:  # noqa: BLE001
            self._watch_failures.failed(log, "[rank %d] watching the alert claim of %s failed", self.rank, event)
            return False
        try:
            if held is None or held.document is None:
                return False
            self._claimed.add(number)
            self._keep_claims_alive()
            log.warning("[rank %d] the trigger alert of %s (summarized by rank %d) has a holder that is gone (its claim "
                        "unchanged for %.1f s): sending it (claim generation %d)", self.rank, event, initiator,
                        board.quiet_for(number), held.generation)
            self._send_in_place(path, held.document, held.generation, held.taken_from,
                                on_done=self._finisher(number, held))
            return True
        except Exception:  # noqa: BLE001
            self._watch_failures.failed(log, "[rank %d] watching the alert claim of %s failed", self.rank, event)
            return False

    def _store_host_lost(self, number: int, initiator: int, confirmed_at: float,
                         initiator_host: tuple[int, ...] | None, on_store_host: bool) -> bool:
        """The store has answered nothing since the first failed read of this event's claim, for
        the takeover hold past the confirmation, the summarizing rank ran on the store's host and
        this rank, not there, is the first watcher the meta does not place there."""
        board = self.claims
        if board is None or initiator_host is None or on_store_host or board.finished(number) or board.client.closed:
            return False  # a closed client asks nothing: its failures say nothing of the store
        survivors = [rank for rank in watchers(initiator, board.world_size) if rank not in initiator_host]
        if not survivors or survivors[0] != self.rank:
            return False
        now = board.now()
        since = self._unanswered_since.setdefault(number, now)
        return now - max(since, confirmed_at) >= self.takeover_hold_seconds

    def _send_without_store(self, folder: Path, number: int, event: str, reason: str, initiator: int,
                            opened: float | None, host_lost: tuple[int, ...] | None = None) -> bool:
        board = self.claims
        assert board is not None
        read = board.last_document(number)  # the summarizing rank's own, where this rank read it in time
        board.finish_here(number)
        self._claimed.add(number)
        try:
            document = read or self._fallback_document(folder, event, reason, initiator, opened)
            if host_lost is None:
                log.warning("[rank %d] the job's store is gone, and with it rank %d, which summarized %s and ran "
                            "alone on the store's host: sending its trigger alert as the event's first watcher",
                            self.rank, initiator, event)
            else:
                log.warning("[rank %d] the job's store has answered nothing for %g s: its host is taken to be lost, and "
                            "with it rank %d, which summarized %s there, and ranks %s: sending its trigger alert as the "
                            "event's first watcher on another host", self.rank, self.takeover_hold_seconds, initiator,
                            event, list(host_lost) or "(none listed)")
            self._send_in_place(alert_path(folder, "trigger"), document, 1, initiator)
            return True
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] sending the trigger alert of %s in place of rank %d failed", self.rank, event,
                        initiator, exc_info=True)
            return False

    def _send_in_place(self, path: Path, document: dict[str, Any], generation: int, taken_from: int | None,
                       on_done: Callable[[], None] | None = None) -> None:
        """Send a trigger another rank held, every sink naming this rank as its sender."""
        path.parent.mkdir(parents=True, exist_ok=True)
        me = sender_record(self.rank, generation)
        entries = {sink.name: {"settings": sink.settings(), "state": "pending", "sender": me,
                               "taken_over_from": taken_from} for sink in self.sinks}
        self._start(path, document, entries=entries, on_done=on_done)

    def settle_claims(self, poll_seconds: float = 0.2) -> None:
        """Before this process ends: the claims it watches of events still confirmed here are
        followed until ``done``, taken over, or for at most twice the takeover hold
        (:attr:`takeover_hold_seconds`); the exit of the job's other ranks would end the watch
        before a holder that is gone could be taken over."""
        board = self.claims
        if board is None:
            return
        deadline = time.monotonic() + 2 * self.takeover_hold_seconds
        while True:
            pending = [(spec, still) for number, (spec, still) in self._watching.items()
                       if number not in self._claimed and not board.finished(number) and still()]
            if not pending or time.monotonic() >= deadline:
                return
            for spec, still in pending:
                arguments = dict(spec)
                self.watch_claim(arguments.pop("folder"), still_confirmed=still, **arguments)
            time.sleep(poll_seconds)

    def _fallback_document(self, folder: Path, event: str, reason: str, initiator: int,
                           opened: float | None) -> dict[str, Any]:
        """What this rank knows of an event whose summarizing rank left no trigger document."""
        summary = read_summary(folder) or {
            "headline": f"{reason} event {event}: the summarizing rank {initiator} is gone and left no alert; "
                        f"its summary is on its host; this rank's dump is in {folder}"}
        return trigger_document(folder, summary, event=event, reason=reason, exit_code=None,
                                dedup_key=dedup_key(folder, summary, event, opened))

    def take_over(self, folder: Path, number: int | None = None) -> list[Path]:
        """Send the alerts of ``folder`` whose sinks are still ``pending`` while the process that
        was sending them is gone (this host only; ``number``: the event's, to claim its trigger
        in the job's store too); returns the files taken over. Never raises."""
        taken: list[Path] = []
        for action in ACTIONS:
            path = alert_path(folder, action)
            try:
                if str(path) in self._sending or not path.exists():
                    continue
                if self._take_over_one(path, number):
                    taken.append(path)
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] taking over %s failed", self.rank, path, exc_info=True)
        return taken

    def _take_over_one(self, path: Path, number: int | None = None) -> bool:
        try:
            document, entries = read_alert(path)
        except BadAlertFile:
            return False  # claimed a moment ago and not written yet, or not an alert file
        orphaned = {name: entry for name, entry in entries.items()
                    if entry.get("state") == "pending" and sender_gone(entry.get("sender"))}
        sinks = [sink for sink in self.sinks if sink.name in orphaned]
        if not sinks:
            return False
        generation = 1 + max(generation_of(entry.get("sender")) for entry in orphaned.values())
        gone = next(iter(orphaned.values())).get("sender") or {}
        held = self._take_from(number, document, gone.get("rank"))
        if held is False:
            return False  # a rank of another host holds it, or it was sent
        if generation > MAX_GENERATION or not claim(takeover_claim_path(path, generation)):
            return False  # another rank took it over first
        me = sender_record(self.rank, generation)
        for sink in sinks:
            entries[sink.name].update(sender=me, taken_over_from=gone.get("rank"))
        log.warning("[rank %d] the %s alert of %s was being sent by rank %s, whose process is gone: sending it "
                    "(%s)", self.rank, document.get("action"), document.get("event"), gone.get("rank"),
                    ", ".join(sink.name for sink in sinks))
        self._start(path, document, entries=entries, sinks=sinks,
                    on_done=self._finisher(number, held if isinstance(held, ClaimRecord) else None))
        return True

    def _take_from(self, number: int | None, document: dict[str, Any], gone_rank: Any) -> ClaimRecord | bool | None:
        """The job-wide claim of a trigger taken over on the sender's host: the record held, False
        when another holder has it, None where the store cannot tell (the host's claim decides)."""
        if self.claims is None or number is None or document.get("action") != "trigger":
            return None
        try:
            held = self.claims.take_from(number, str(document.get("event")), gone_rank if isinstance(gone_rank, int)
                                         else None, document)
        except Exception:  # noqa: BLE001 - the store's host may be the rank that died
            log.warning("[rank %d] the job-wide alert claim could not be read: this host's claim decides", self.rank,
                        exc_info=True)
            return None
        if held is not None:
            self._claimed.add(number)
            self._keep_claims_alive()
        return held if held is not None else False

    def _start(self, path: Path, document: dict[str, Any], after: threading.Thread | None = None, *,
               entries: dict[str, dict[str, Any]] | None = None, sinks: list[Sink] | None = None,
               on_done: Callable[[], None] | None = None) -> threading.Thread:
        sinks = self.sinks if sinks is None else sinks
        if entries is None:
            me = sender_record(self.rank)
            entries = {sink.name: {"settings": sink.settings(), "state": "pending", "sender": me} for sink in sinks}
        self._sending.add(str(path))
        write_alert(path, document, entries)  # kept even if this process dies while sending
        key = f"{document.get('event')}/{document.get('action')}"

        def send() -> None:
            if after is not None:  # PagerDuty would open an incident a resolve sent first never closes
                after.join(self.policy.deadline_seconds + 1.0)
            try:
                deliver(path, document, sinks, entries, self.policy)
            except Exception:  # noqa: BLE001
                log.warning("delivering %s failed; the alert stays in %s", key, path, exc_info=True)
            if on_done is not None:
                try:
                    on_done()
                except Exception:  # noqa: BLE001 - the store's host may be gone
                    log.warning("recording %s as done in the job's store failed", key, exc_info=True)

        thread = threading.Thread(target=send, name="ncclx-alert", daemon=True)
        thread.start()
        waits = 2 if after is not None else 1
        self._threads.append((thread, time.monotonic() + waits * (self.policy.deadline_seconds + 1.0)))
        return thread

    def drain(self) -> None:
        """Wait for the alerts being sent, each at most until its deadline (after
        :meth:`settle_claims`: a takeover it starts is waited for too)."""
        try:
            self.settle_claims()
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] following the alert claims before the exit failed", self.rank, exc_info=True)
        for thread, deadline in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [(t, d) for t, d in self._threads if t.is_alive()]
