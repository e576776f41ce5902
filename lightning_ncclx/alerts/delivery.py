"""Deliver one alert to its sinks: one thread per sink (a hanging endpoint does not hold up the
others), each attempt bounded, retries with backoff (1 s, 2 s, 4 s ...), everything within one
deadline. The alert file records each sink's outcome."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from lightning_ncclx.alerts.outbox import write_alert
from lightning_ncclx.alerts.sinks import DeliveryError, Sink

log = logging.getLogger(__name__)

BACKOFF_SECONDS = 1.0


@dataclass(frozen=True)
class Policy:
    attempt_timeout_seconds: float
    attempts: int
    deadline_seconds: float


def _attempts(sink: Sink, document: Mapping[str, Any], path: Path, policy: Policy, deadline: float,
              entry: dict[str, Any]) -> None:
    for attempt in range(policy.attempts):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        entry["attempts"] = int(entry.get("attempts") or 0) + 1
        try:
            sink.deliver(document, path, min(policy.attempt_timeout_seconds, remaining))
        except DeliveryError as err:
            entry.update(state="failed", error=str(err))
        except Exception as err:  # noqa: BLE001 - a sink's bug costs its alert, never the job
            entry.update(state="failed", error=f"{type(err).__name__}")
            log.warning("alert sink %s failed unexpectedly", sink.name, exc_info=True)
        else:
            entry.update(state="sent", error=None, sent_at=time.time())
            return
        pause = min(BACKOFF_SECONDS * 2 ** attempt, deadline - time.monotonic())
        if attempt + 1 < policy.attempts and pause > 0:
            time.sleep(pause)


def deliver(path: Path, document: Mapping[str, Any], sinks: list[Sink], entries: dict[str, dict[str, Any]],
            policy: Policy) -> list[str]:
    """Send ``document`` to every sink (``entries``: their records in the alert file, updated in
    place); returns the names of the sinks that did not take it within the deadline. The file is
    written again as each sink finishes: a process killed meanwhile leaves what was done."""
    deadline = time.monotonic() + policy.deadline_seconds
    threads = []
    lock = threading.Lock()

    def attempts_then_record(sink: Sink, entry: dict[str, Any]) -> None:
        _attempts(sink, document, path, policy, deadline, entry)
        with lock:
            try:
                write_alert(path, document, entries)
            except OSError:
                log.warning("recording the alert's delivery in %s failed", path, exc_info=True)

    for sink in sinks:
        entry = entries.setdefault(sink.name, {"settings": sink.settings()})
        entry.setdefault("state", "pending")
        thread = threading.Thread(target=attempts_then_record, args=(sink, entry),
                                  name=f"ncclx-alert-{sink.name}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    # a thread still running past the deadline keeps its entry to itself: recorded as not sent
    record = {name: dict(entry, state=entry.get("state") if entry.get("state") == "sent" else "failed")
              for name, entry in entries.items()}
    for name, entry in record.items():
        if entry["state"] != "sent" and not entry.get("error"):
            entry["error"] = f"no answer within the {policy.deadline_seconds:g} s deadline"
    try:
        with lock:
            write_alert(path, document, record)
    except OSError:
        log.warning("recording the alert's delivery in %s failed", path, exc_info=True)
    failed = [name for name, entry in record.items() if entry["state"] != "sent"]
    action = document.get("action")
    for name in failed:
        log.warning("%s alert of %s not delivered to %s: %s; kept in %s (lightning-ncclx alerts resend %s)",
                    action, document.get("event"), name, record[name].get("error"), path, path)
    if not failed:
        log.warning("%s alert of %s delivered to %s", action, document.get("event"), ", ".join(record))
    return failed
