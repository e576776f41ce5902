"""One ``summary.json`` read as an :class:`Incident` for ``lightning-ncclx history``.

Run folders are often shared and writable by others: a file named ``summary.json`` may be a FIFO,
a link to ``/dev/zero``, gigabytes, JSON nested a million deep or fields of any type. It is read
as ``summarize`` reads a side file (a regular file only, size capped: :mod:`analysis.safe_read`)
and every field ``history`` uses is type-checked; a file that does not check is not an incident,
and the reason says which field is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import lightning_ncclx.analysis.rank_sets as rank_sets
from lightning_ncclx.analysis.collection_file import recovery_from
from lightning_ncclx.analysis.members import MAX_RANK
from lightning_ncclx.analysis.safe_read import MAX_SIDE_FILE_BYTES, read_regular
from lightning_ncclx.errors import DumpReadError

MAX_SUMMARY_BYTES = MAX_SIDE_FILE_BYTES
"""A summary of 16,384 ranks is under 512 KiB (rank sets as ranges, per-rank tables as classes)."""
MAX_TEXT_CHARS = 300
"""Characters kept of any text field (a host, a call site, a verdict)."""
SCHEMA_PREFIX = "lightning-ncclx/summary/"
_KIND = re.compile(r"[a-z_]{1,64}")


@dataclass(frozen=True)
class Incident:
    folder: str
    event: str
    run_id: str | None
    job_id: str | None
    time: str | None
    kind: str
    verdict: str
    culprit_ranks: tuple[int, ...]
    culprit_hosts: tuple[str, ...]
    call_site: str | None
    op: str | None
    recovered_after_seconds: float | None = None
    """Set when the event recovered: not a hang."""
    store_lost: bool = False
    """A ``store-lost-NNN`` folder: the job's store died with its host and each surviving rank
    dumped alone (:mod:`lightning_ncclx.report.store_lost`)."""
    dumped_ranks: tuple[int, ...] = ()
    """Store-lost folders: the ranks that wrote their dump there."""
    missing_ranks: tuple[int, ...] = ()
    """Store-lost folders: the ranks of the job that did not (the store's host among them)."""
    store_lost_seen: str | None = None
    """Store-lost folders: what a writer saw when the store went (its exception, else why)."""


class NotAnIncident(ValueError):
    """Why a ``summary.json`` was not read as an incident."""


def read_incident(path: Path) -> Incident:
    """The incident ``path`` describes; NotAnIncident saying why it is none."""
    try:
        data = json.loads(read_regular(path, MAX_SUMMARY_BYTES, "summary.json"))
    except DumpReadError as error:
        raise NotAnIncident(str(error)) from None
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise NotAnIncident(f"not JSON ({type(error).__name__}: {str(error)[:80]})") from None
    return incident_from(data, path)


def incident_from(d: Any, path: Path) -> Incident:
    """The incident of one decoded summary (``path``: where it is, or would be, written)."""
    if not isinstance(d, dict) or not isinstance(d.get("schema"), str) or not d["schema"].startswith(SCHEMA_PREFIX):
        raise NotAnIncident(f"not a lightning-ncclx summary.json (no 'schema' starting {SCHEMA_PREFIX!r})")
    inc = _mapping(d, "incident")
    hosts = _hosts(d)
    culprits = _ranks(d, "culprit_ranks")
    culprit_hosts = tuple(sorted({_clip(hosts[r]) for r in culprits if r in hosts}))
    kind = d.get("hang_kind")
    if kind is not None and not (isinstance(kind, str) and _KIND.fullmatch(kind)):
        raise NotAnIncident(f"hang_kind is {_shown(kind)}, not a hang kind")
    recovery = recovery_from(d.get("recovery"))
    return Incident(
        recovered_after_seconds=recovery.lasted_seconds if recovery is not None else None,
        folder=str(path.parent), event=_text(inc, "event", "incident.") or _clip(path.parent.name),
        run_id=_text(inc, "run_id", "incident."), job_id=_text(inc, "job_id", "incident."),
        time=_text(inc, "dumped_at", "incident.") or _text(inc, "summarized_at", "incident.") or _mtime(path),
        kind=kind or "unknown", verdict=_text(d, "verdict") or "?",
        culprit_ranks=culprits, culprit_hosts=culprit_hosts or _texts(d, "hosts_to_exclude"),
        call_site=_call_site(d), op=_text(d, "op"))


def _shown(value: Any) -> str:
    return f"a {type(value).__name__}" if isinstance(value, (dict, list)) else _clip(repr(value), 60)


def _clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _mapping(d: dict, key: str) -> dict:
    value = d.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise NotAnIncident(f"{key} is {_shown(value)}, not an object")
    return value


def _text(d: dict, key: str, where: str = "") -> str | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise NotAnIncident(f"{where}{key} is {_shown(value)}, not text")
    return _clip(value)


def _texts(d: dict, key: str) -> tuple[str, ...]:
    value = d.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NotAnIncident(f"{key} is {_shown(value)}, not a list of text")
    return tuple(_clip(v) for v in value)


def _ranks(d: dict, key: str) -> tuple[int, ...]:
    """A rank set (schema 2: a list, or ranges past 64 ranks; schema 1: a list)."""
    value = d.get(key)
    if value is None:
        return ()
    try:
        ranks = rank_sets.decode(value)
    except ValueError:
        ranks = (MAX_RANK,)
    if any(r >= MAX_RANK for r in ranks):
        raise NotAnIncident(f"{key} is {_shown(value)}, not a list of ranks (or ranges) from 0 to {MAX_RANK - 1}")
    return ranks


def _hosts(d: dict) -> dict[int, str]:
    """rank -> host: schema 2's ``host_ranks`` (host -> rank set), else schema 1's ``hosts``."""
    try:
        return rank_sets.rank_map(d, "host_ranks", "hosts")
    except ValueError as error:
        raise NotAnIncident(_clip(str(error), 200)) from None


def _call_site(d: dict) -> str | None:
    findings = d.get("findings")
    if findings is None or findings == []:
        return None
    if not isinstance(findings, list) or not isinstance(findings[0], dict):
        raise NotAnIncident(f"findings is {_shown(findings)}, not a list of findings")
    states = findings[0].get("culprit_states")
    if states is None:
        return None
    if not isinstance(states, list) or not all(isinstance(s, dict) for s in states):
        raise NotAnIncident(f"findings.0.culprit_states is {_shown(states)}, not a list of objects")
    for state in states:
        location = _text(state, "location", "findings.0.culprit_states.")
        if location:
            return location
    return None


def _mtime(path: Path) -> str | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC).isoformat(timespec="seconds")
    except (OSError, ValueError, OverflowError):  # a file dated past year 9999
        return None
