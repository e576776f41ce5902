"""Is this rank blocked in a collective right now, and in which one? Asked by the watchdog thread.

Reads each recorder's ``pg_status`` (per process group: the last op enqueued and the last op
completed) through the JSON dump without entries, which takes well under a millisecond even with
a 20,000-entry buffer (the full dump takes ~0.3 s there; gloo never marks an entry completed, so
``onlyActive`` would return them all). An op enqueued but not completed is one the rank waits in
(gloo runs collectives synchronously; on NCCL it may also still be running on the GPU, which the
consensus tolerates: it needs every rank's step to have overrun first).

Legacy NCCL may leave ``last_completed_collective`` at -1; there the active entries decide.

Point-to-point (:func:`p2p_waits`): gloo records no send or recv at all, so those come from the
ProcessGroup hooks of :mod:`lightning_ncclx.dump.p2p_ops`; the NCCL recorders (legacy NCCL and
nccl2's hook) record them as entries (``nccl:send 0->1``, ``is_p2p``), read from the active entries
of the groups whose counters show an unfinished op.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from lightning_ncclx.dump.p2p_ops import TRACKER, P2PInFlight
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
    from lightning_ncclx.backend.torch_api import dump_fr_trace_json, dump_nccl_trace_json

    if file_tag == "nccl":
        raw = dump_nccl_trace_json(include_entries, True)
    else:
        raw = dump_fr_trace_json(include_entries, True, file_tag)
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
        if file_tag == "gloo" and completed is not None and enqueued > 0:
            # gloo's counter is exact and op ids start at 1: -1 is "none completed yet" (a new
            # group, e.g. a device mesh's, waiting in its first op)
            out.append(BlockedIn(file_tag, str(pg_id), 1))
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


_P2P_NAME = re.compile(r"^(send|recv)\s+(-?\d+|\?)\s*(->|<-)\s*(-?\d+|\?)")


def p2p_from_entries(file_tag: str, entries: Any, pg_config: Any) -> list[P2PInFlight]:
    """The unfinished send/recv entries of one NCCL recorder's active entries; group ranks become
    global ranks through the dump's ``pg_config`` (-1 where it does not say)."""
    out: list[P2PInFlight] = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or not e.get("is_p2p") or e.get("state") == "completed":
            continue
        match = _P2P_NAME.match(str(e.get("profiling_name", "")).rpartition(":")[2])
        pg, op_id = e.get("process_group"), _as_int(e.get("op_id"))
        if not match or not isinstance(pg, (list, tuple)) or not pg or op_id is None:
            continue
        op, a, arrow, b = match.groups()
        first, second = (int(a) if a != "?" else -1), (int(b) if b != "?" else -1)
        src, dst = (first, second) if arrow == "->" else (second, first)
        group = str(pg[0])
        peer_in_group = dst if op == "send" else src
        out.append(P2PInFlight(group, op_id, op, src, dst, _global(pg_config, group, peer_in_group), file_tag))
    return out


def _counter(status: dict, key: str) -> int:
    value = _as_int(status.get(key))
    return -1 if value is None else value


def _global(pg_config: Any, group: str, group_rank: int) -> int:
    row = pg_config.get(group) if isinstance(pg_config, dict) else None
    ranks = row.get("ranks") if isinstance(row, dict) else None
    try:
        members = json.loads(ranks) if isinstance(ranks, str) else list(ranks or [])
        return int(members[group_rank]) if 0 <= group_rank < len(members) else -1
    except (ValueError, TypeError, IndexError):
        return -1


def p2p_waits() -> list[P2PInFlight]:
    """Every send and recv this rank has in flight, over all its backends (see the module
    docstring). Never raises."""
    found: list[P2PInFlight] = []
    try:
        found += TRACKER.in_flight()
    except Exception:  # noqa: BLE001
        log.debug("reading the tracked point-to-point ops failed", exc_info=True)
    try:
        backends = [b for b in backends_in_use() if b.file_tag != "gloo"]
    except Exception:  # noqa: BLE001
        log.debug("listing the backends in use failed", exc_info=True)
        return found
    for item in backends:
        try:
            status = _status_json(item.file_tag, include_entries=False).get("pg_status")
            unfinished = isinstance(status, dict) and any(
                isinstance(s, dict) and _counter(s, "last_enqueued_collective") > _counter(s, "last_completed_collective")
                for s in status.values())
            if unfinished:
                data = _status_json(item.file_tag, include_entries=True)
                found += p2p_from_entries(item.file_tag, data.get("entries"), data.get("pg_config"))
        except Exception:  # noqa: BLE001 - the probe must never disturb the watchdog
            log.debug("reading the p2p entries of %s failed", item.name, exc_info=True)
    return sorted(found, key=lambda op: op.started)
