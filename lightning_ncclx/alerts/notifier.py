"""The alerts of one rank's watchdog: a trigger once an event is confirmed as a hang, a resolve
when a triggered event recovers. Only the rank that wrote the summary calls it, and the alert
file is claimed (created exclusively) before sending: one alert per event and action.

Delivery runs on a daemon thread; :meth:`AlertNotifier.drain` lets a rank about to exit wait for
it, at most until the alert's deadline (``ncclx.alerts.deadline_seconds``)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from lightning_ncclx.alerts.delivery import Policy, deliver
from lightning_ncclx.alerts.message import dedup_key, read_summary, resolve_document, trigger_document
from lightning_ncclx.alerts.outbox import BadAlertFile, alert_path, claim, read_alert, write_alert
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

    def __init__(self, config: AlertsConfig) -> None:
        self.config = config
        self.sinks = sinks_of(config)
        self.policy = policy_of(config)
        self._threads: list[tuple[threading.Thread, float]] = []
        self._triggers: dict[str, threading.Thread] = {}
        """Event folder -> the thread sending its trigger: a resolve goes out only after it."""

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

    def _start(self, path: Path, document: dict[str, Any], after: threading.Thread | None = None) -> threading.Thread:
        entries = {sink.name: {"settings": sink.settings(), "state": "pending"} for sink in self.sinks}
        write_alert(path, document, entries)  # kept even if this process dies while sending
        key = f"{document.get('event')}/{document.get('action')}"

        def send() -> None:
            if after is not None:  # PagerDuty would open an incident a resolve sent first never closes
                after.join(self.policy.deadline_seconds + 1.0)
            try:
                deliver(path, document, self.sinks, entries, self.policy)
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
