"""The alerts of one rank's watchdog: a trigger once an event is confirmed as a hang, a resolve
when a triggered event recovers. Only the rank that wrote the summary calls it, and the alert
file is claimed (created exclusively) before sending: one alert per event and action.

A sender SIGKILLed while sending leaves its sinks ``pending`` in the file, each naming it as the
sender; another rank that follows the event on the same host sends them instead
(:meth:`AlertNotifier.take_over`), once its process is gone and after claiming the next
takeover generation exclusively: one rank takes over, and never while the sender lives.

Delivery runs on a daemon thread; :meth:`AlertNotifier.drain` lets a rank about to exit wait for
it, at most until the alert's deadline (``ncclx.alerts.deadline_seconds``)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

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

    def trigger(self, folder: Path, *, event: str, reason: str, exit_code: int | None) -> None:
        try:
            path = alert_path(folder, "trigger")
            if not claim(path):
                log.info("%s: an alert was already sent for this event (%s)", event, path)
                return
            summary = read_summary(folder) or {}
            document = trigger_document(folder, summary, event=event, reason=reason, exit_code=exit_code,
                                        dedup_key=dedup_key(folder, summary, event))
            self._triggers[str(folder)] = self._start(path, document)
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

    def take_over(self, folder: Path) -> list[Path]:
        """Send the alerts of ``folder`` whose sinks are still ``pending`` while the process that
        was sending them is gone (this host only); returns the files taken over. Never raises."""
        taken: list[Path] = []
        for action in ACTIONS:
            path = alert_path(folder, action)
            try:
                if str(path) in self._sending or not path.exists():
                    continue
                if self._take_over_one(path):
                    taken.append(path)
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] taking over %s failed", self.rank, path, exc_info=True)
        return taken

    def _take_over_one(self, path: Path) -> bool:
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
        if generation > MAX_GENERATION or not claim(takeover_claim_path(path, generation)):
            return False  # another rank took it over first
        gone = next(iter(orphaned.values())).get("sender") or {}
        me = sender_record(self.rank, generation)
        for sink in sinks:
            entries[sink.name].update(sender=me, taken_over_from=gone.get("rank"))
        log.warning("[rank %d] the %s alert of %s was being sent by rank %s, whose process is gone: sending it "
                    "(%s)", self.rank, document.get("action"), document.get("event"), gone.get("rank"),
                    ", ".join(sink.name for sink in sinks))
        self._start(path, document, entries=entries, sinks=sinks)
        return True

    def _start(self, path: Path, document: dict[str, Any], after: threading.Thread | None = None, *,
               entries: dict[str, dict[str, Any]] | None = None, sinks: list[Sink] | None = None) -> threading.Thread:
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

        thread = threading.Thread(target=send, name="ncclx-alert", daemon=True)
        thread.start()
        waits = 2 if after is not None else 1
        self._threads.append((thread, time.monotonic() + waits * (self.policy.deadline_seconds + 1.0)))
        return thread

    def drain(self) -> None:
        """Wait for the alerts being sent, each at most until its deadline."""
        for thread, deadline in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [(t, d) for t, d in self._threads if t.is_alive()]
