"""Is this rank blocked in a collective right now, and in which one? Asked by the watchdog thread.

Reads each recorder's ``pg_status`` (per process group: the last op enqueued and the last op
completed) through the JSON dump without entries, which takes well under a millisecond even with
a 20,000-entry buffer (the full dump takes ~0.3 s there; gloo never marks an entry completed, so
``onlyActive`` would return them all). An op enqueued but not completed is one the rank waits in
(gloo runs collectives synchronously; on NCCL it may also still be running on the GPU, which the
consensus tolerates: it needs every rank's step to have overrun first).

Legacy NCCL may leave ``last_completed_collective`` at -1; there the active entries decide.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from lightning_ncclx.dump.traces import backends_in_use

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class BlockedIn:
    """One collective this rank has enqueued and not completed."""

    backend: str
    pg_id: str
    op_id: int
    """The group's op counter (``pg_status`` counts ops, p2p included), of the oldest unfinished op."""

    def label(self) -> str:
        return f"{self.backend} group {self.pg_id} op {self.op_id}"


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _status_json(file_tag: str, include_entries: bool) -> dict[str, Any]:
    from torch._C import _distributed_c10d as c

    if file_tag == "nccl":
        raw = c._dump_nccl_trace_json(include_entries, True)
    else:
        try:
            raw = c._dump_fr_trace_json(include_entries, True, backend=file_tag)
        except TypeError:  # torch 2.13: one recorder, no backend argument
            raw = c._dump_fr_trace_json(include_entries, True)
    data = json.loads(raw)
    return data if isinstance(data, dict) else {}


def blocked_from_status(file_tag: str, pg_status: Any, active_entries: list[Any] | None) -> list[BlockedIn]:
    """The unfinished op of each group in one recorder's ``pg_status``; ``active_entries`` (the
    JSON dump's entries with ``onlyActive``) decide a group whose completed counter is unknown."""
    out: list[BlockedIn] = []
    if not isinstance(pg_status, dict):
        return out
    for pg_id, status in pg_status.items():
        if not isinstance(status, dict):
            continue
        enqueued = _as_int(status.get("last_enqueued_collective"))
        completed = _as_int(status.get("last_completed_collective"))
        if enqueued is None or enqueued < 0:
            continue
        if completed is not None and completed >= 0:
            if enqueued > completed:
                out.append(BlockedIn(file_tag, str(pg_id), completed + 1))
            continue
        ops = [_as_int(e.get("op_id")) for e in active_entries or []
               if isinstance(e, dict) and str(e.get("pg_id")) == str(pg_id) and e.get("state") != "completed"]
        ops = [op for op in ops if op is not None]
        if ops:
            out.append(BlockedIn(file_tag, str(pg_id), min(ops)))
    return out


def blocked_collectives() -> list[BlockedIn]:
    """Every collective this rank is waiting in, over all its backends (empty: none, or no
    process group). Never raises: a backend whose status cannot be read is left out."""
    found: list[BlockedIn] = []
    try:
        backends = backends_in_use()
    except Exception:  # noqa: BLE001
        log.debug("listing the backends in use failed", exc_info=True)
        return found
    for item in backends:
        try:
            data = _status_json(item.file_tag, include_entries=False)
            status = data.get("pg_status")
            needs_entries = item.file_tag != "gloo" and isinstance(status, dict) and any(
                isinstance(s, dict) and (_as_int(s.get("last_completed_collective")) or 0) < 0
                and (_as_int(s.get("last_enqueued_collective")) or -1) >= 0 for s in status.values())
            entries = _status_json(item.file_tag, include_entries=True).get("entries") if needs_entries else None
            found += blocked_from_status(item.file_tag, status, entries if isinstance(entries, list) else None)
        except Exception:  # noqa: BLE001 - the probe must never disturb the watchdog
            log.debug("reading the recorder status of %s failed", item.name, exc_info=True)
    return sorted(found)
