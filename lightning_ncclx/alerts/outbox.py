"""The alert file in the event folder (``alert-trigger.json``, ``alert-resolve.json``): the
document and, per sink, its settings (environment variable names, never their values) and
state (``pending``, ``sent``, ``failed`` with the last error). Written before the first attempt
and after each sink's last, so an alert the process could not send (it was killed, the
endpoint was down) stays there for ``lightning-ncclx alerts resend``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from lightning_ncclx.files import atomic_write_text

ALERT_FILE_PREFIX = "alert-"
MAX_ALERT_FILE_BYTES = 1024 * 1024
ACTIONS = ("trigger", "resolve")


class BadAlertFile(ValueError):
    """Not an alert file this version can read; the message says why."""


def alert_path(folder: Path, action: str) -> Path:
    return folder / f"{ALERT_FILE_PREFIX}{action}.json"


def claim(path: Path) -> bool:
    """Create ``path`` if no process did yet: True for the one caller that sends this alert."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def takeover_claim_path(path: Path, generation: int) -> Path:
    """The file a rank creates exclusively to send ``path``'s alert in place of a sender that is
    gone (``generation`` 1 for the first takeover, 2 if that rank died too, ...)."""
    return path.with_name(f".{path.name}.takeover-{generation}")


def write_alert(path: Path, document: Mapping[str, Any], sinks: Mapping[str, Mapping[str, Any]]) -> None:
    atomic_write_text(path, json.dumps({"document": dict(document), "sinks": {k: dict(v) for k, v in sinks.items()}},
                                       indent=1) + "\n")


def read_alert(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(document, sinks) of an alert file; :class:`BadAlertFile` when it is not one."""
    try:
        if path.stat().st_size > MAX_ALERT_FILE_BYTES:
            raise BadAlertFile(f"{path}: over {MAX_ALERT_FILE_BYTES // 1024} KiB, not an alert file")
        value = json.loads(path.read_bytes())
    except OSError as err:
        raise BadAlertFile(f"{path}: cannot be read ({err.strerror or err})") from None
    except ValueError:
        raise BadAlertFile(f"{path}: not JSON (an alert file is written by the watchdog)") from None
    document = value.get("document") if isinstance(value, dict) else None
    sinks = value.get("sinks") if isinstance(value, dict) else None
    if not isinstance(document, dict) or not isinstance(sinks, dict) \
            or document.get("action") not in ACTIONS or not all(isinstance(v, dict) for v in sinks.values()):
        raise BadAlertFile(f"{path}: not an alert file (expected 'document' with an action and 'sinks')")
    return document, sinks


def unsent(sinks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [name for name, entry in sinks.items() if entry.get("state") != "sent"]
