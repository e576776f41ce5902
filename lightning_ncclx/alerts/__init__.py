"""Alerts on confirmed hangs: the message (:mod:`message`), the sinks (:mod:`sinks`: JSON
webhook, PagerDuty Events v2, a local command), the alert file kept in the event folder until
every sink took it (:mod:`outbox`), bounded delivery with retries (:mod:`delivery`) and the
per-rank notifier the watchdog calls (:mod:`notifier`).

Secrets (webhook URLs, routing keys) are read from the environment at send time, by the names
in :class:`~lightning_ncclx.config.AlertsConfig`; no file or log line holds them.
"""

from lightning_ncclx.alerts.notifier import AlertNotifier

__all__ = ["AlertNotifier"]
