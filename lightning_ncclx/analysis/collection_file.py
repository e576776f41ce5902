"""What the watchdog knew about an event when it collected it (``collection.json``, written by
``events.collection``): ranks whose process had exited, ranks alive but silent, ranks read from a
digest only, store values it left out, whether the event recovered, and how a gone rank's process
ended where that could be known (``gone_exits``).

The file sits in a folder anyone may hand to ``summarize``: every field is checked, and a field
that does not check is read as absent."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lightning_ncclx.analysis.model import Recovery
from lightning_ncclx.analysis.safe_read import MAX_SIDE_FILE_BYTES, read_regular
from lightning_ncclx.errors import DumpReadError
from lightning_ncclx.layout import COLLECTION_FILE

MAX_REFUSED_LINES = 50
MAX_REFUSED_CHARS = 300
MAX_LASTED_SECONDS = 10.0 ** 7
"""Longer than any run: a recovery said to have lasted more is not believed."""


@dataclass(frozen=True)
class CollectionFacts:
    gone_ranks: tuple[int, ...] = ()
    silent_ranks: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    digest_only_ranks: tuple[int, ...] = ()
    refused: tuple[str, ...] = ()
    recovery: Recovery | None = None
    gone_exits: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Gone rank -> how its process ended, where the watchdog could know it: ``{"signal": "SIGABRT"
    or None, "status": 134 or None, "known_from": text or None}``; ``peers_saw`` (rank ->
    exception) where it could not."""


_SIGNAL = re.compile(r"SIG[A-Z0-9]{1,12}")
MAX_EXIT_TEXT = 300


def _gone_exits(raw: Any, gone: tuple[int, ...]) -> dict[int, dict[str, Any]]:
    """``gone_exits`` of collection.json, each field checked; only ranks listed as gone."""
    out: dict[int, dict[str, Any]] = {}
    for key, entry in (raw.items() if isinstance(raw, dict) else ()):
        if not (isinstance(key, str) and key.isdigit() and int(key) in gone and isinstance(entry, dict)):
            continue
        sig = entry.get("signal")
        status = entry.get("status")
        known = entry.get("known_from")
        saw = entry.get("peers_saw")
        out[int(key)] = {
            "signal": sig if isinstance(sig, str) and _SIGNAL.fullmatch(sig) else None,
            "status": status if isinstance(status, int) and not isinstance(status, bool) and 0 <= status <= 255
            else None,
            "known_from": known[:MAX_EXIT_TEXT] if isinstance(known, str) else None,
            "peers_saw": {k: v[:MAX_EXIT_TEXT] for k, v in list(saw.items())[:8]
                          if isinstance(k, str) and k.isdigit() and isinstance(v, str)} if isinstance(saw, dict) else {},
        }
    return out


def _rank_list(raw: Any) -> tuple[int, ...]:
    return tuple(sorted({r for r in raw if isinstance(r, int) and not isinstance(r, bool) and r >= 0})) \
        if isinstance(raw, list) else ()


def _count(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= 1 << 24 else None


def recovery_from(raw: Any) -> Recovery | None:
    """``{"recovered": true, "lasted_seconds": 11.8, "ranks_moved_on": 4}`` -> :class:`Recovery`;
    None for anything else."""
    if not isinstance(raw, dict) or raw.get("recovered") is not True:
        return None
    lasted = raw.get("lasted_seconds")
    if isinstance(lasted, bool) or not isinstance(lasted, (int, float)) or not math.isfinite(lasted):
        return None
    if not 0 <= lasted <= MAX_LASTED_SECONDS:
        return None
    return Recovery(float(lasted), _count(raw.get("ranks_moved_on")))


def _refused(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list):
        return ()
    lines = [r[:MAX_REFUSED_CHARS] for r in raw[:MAX_REFUSED_LINES] if isinstance(r, str)]
    if len(raw) > MAX_REFUSED_LINES:
        lines.append(f"... and {len(raw) - MAX_REFUSED_LINES} more (collection.json)")
    return tuple(lines)


def read_collection(root: Path) -> CollectionFacts:
    """The facts of ``root / collection.json``; empty without that file or when it does not parse."""
    path = root / COLLECTION_FILE
    if not os.path.lexists(path):
        return CollectionFacts()
    try:
        data = json.loads(read_regular(path, MAX_SIDE_FILE_BYTES, "collection file"))
    except (DumpReadError, ValueError, RecursionError):
        return CollectionFacts()
    if not isinstance(data, dict):
        return CollectionFacts()
    silent: dict[int, dict] = {}
    silent_raw = data.get("silent_ranks")
    for key, proc in (silent_raw.items() if isinstance(silent_raw, dict) else ()):
        if str(key).isdigit() and isinstance(proc, dict):
            silent[int(key)] = {k: proc.get(k) for k in ("pid", "host", "state")}
    gone = _rank_list(data.get("gone_ranks"))
    return CollectionFacts(gone, silent, _rank_list(data.get("digest_only_ranks")),
                           _refused(data.get("refused")), recovery_from(data.get("recovery")),
                           _gone_exits(data.get("gone_exits"), gone))
