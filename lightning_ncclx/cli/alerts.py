"""``lightning-ncclx alerts resend PATH...``: send the alerts the watchdog could not deliver
(``alert-trigger.json``, ``alert-resolve.json`` in event folders), to the sinks that did not
take them, with the secrets read from the environment variables the file names.

Exit 0 every alert delivered (or nothing left to send), 1 some sink still failed, 2 bad input."""

from __future__ import annotations

import sys
from pathlib import Path

from lightning_ncclx.alerts.delivery import deliver
from lightning_ncclx.alerts.notifier import policy_of
from lightning_ncclx.alerts.outbox import ALERT_FILE_PREFIX, BadAlertFile, read_alert, unsent
from lightning_ncclx.alerts.sinks import sinks_from_settings
from lightning_ncclx.config import AlertsConfig
from lightning_ncclx.exit_status import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK

MAX_DEPTH = 4


def alert_files(path: Path) -> list[Path]:
    """``path`` itself, or the alert files in it and up to ``MAX_DEPTH`` folders below."""
    if path.is_file():
        return [path]
    found: list[Path] = []
    for depth in range(MAX_DEPTH + 1):
        found += sorted(path.glob("/".join(["*"] * depth + [f"{ALERT_FILE_PREFIX}*.json"])))
    return [p for p in found if p.is_file()]


def run_resend(paths: list[Path]) -> int:
    files: list[Path] = []
    for path in paths:
        if not path.exists():
            print(f"lightning-ncclx alerts resend: {path}: no such file or folder", file=sys.stderr)
            return EXIT_BAD_INPUT
        files += alert_files(path)
    if not files:
        print(f"lightning-ncclx alerts resend: no alert file (alert-*.json) under {', '.join(map(str, paths))}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    policy = policy_of(AlertsConfig())
    bad = failed = 0
    for path in files:
        try:
            document, entries = read_alert(path)
            todo = unsent(entries)
            sinks = sinks_from_settings({name: entries[name] for name in todo})
        except (BadAlertFile, ValueError) as err:
            print(f"lightning-ncclx alerts resend: skipped {err}", file=sys.stderr)
            bad += 1
            continue
        if not sinks:
            print(f"{path}: already delivered to {', '.join(entries) or 'no sink'}")
            continue
        still = deliver(path, document, sinks, entries, policy)
        for entry_name in todo:
            state = "NOT delivered: " + str(entries[entry_name].get("error")) if entry_name in still else "delivered"
            print(f"{path}: {document.get('action')} -> {entry_name}: {state}")
        failed += bool(still)
    if failed:
        return EXIT_FINDING
    return EXIT_BAD_INPUT if bad and bad == len(files) else EXIT_OK
