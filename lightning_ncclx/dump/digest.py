"""A rank's dump cut down to what a diagnosis needs first: the frontier of every group.

The two-phase gather (see :mod:`lightning_ncclx.events.gather`) sends every rank's digest
through the store and full dumps only from the culprits and a few peers, so an event at 16k
ranks moves megabytes, not gigabytes. A digest is the same files in the same format, smaller:

- each flight-recorder trace keeps its newest ``ENTRIES_PER_GROUP`` entries per process group
  (collectives and p2p apart), call stacks only on the newest ``FRAMES_PER_GROUP`` of them; a
  group's member list longer than ``MAX_LISTED_MEMBERS`` is replaced by its hash, which the
  summarizing rank puts back from its own view of the groups (:func:`restore_members`);
- ``context.json`` without the fields that grow with the job (``pg_config``, the recorder
  environment);
- the stacks file: the main thread's stack only.

The analyzer reads a digest like any dump whose ring buffer held fewer entries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from pathlib import Path
from typing import Any

from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.layout import CONTEXT_SUFFIX, STACKS_SUFFIX, TRACE_SUFFIX

log = logging.getLogger(__name__)

ENTRIES_PER_GROUP = 8
FRAMES_PER_GROUP = ENTRIES_PER_GROUP
MAX_LISTED_MEMBERS = 64
MAX_STACKS_CHARS = 8192
HASHED_MEMBERS_PREFIX = "members-blake2b:"
_CONTEXT_FIELDS_LEFT_OUT = ("pg_config", "flight_recorder")


def members_hash(ranks: str) -> str:
    return HASHED_MEMBERS_PREFIX + hashlib.blake2b(ranks.encode(), digest_size=16).hexdigest()


def _group_key(entry: Any) -> tuple[str, bool]:
    group = entry.get("process_group") if isinstance(entry, dict) else None
    name = str(group[0]) if isinstance(group, (list, tuple)) and group else "?"
    return name, bool(entry.get("is_p2p")) if isinstance(entry, dict) else False


def trim_trace(trace: dict[str, Any]) -> dict[str, Any]:
    """The newest entries of each group (file order kept), frames on the newest few only."""
    entries = trace.get("entries")
    out = dict(trace)
    if isinstance(entries, list):
        kept: list[Any] = []
        seen: dict[tuple[str, bool], int] = {}
        for entry in reversed(entries):
            key = _group_key(entry)
            count = seen.get(key, 0)
            if count >= ENTRIES_PER_GROUP:
                continue
            seen[key] = count + 1
            if count >= FRAMES_PER_GROUP and isinstance(entry, dict) and entry.get("frames"):
                entry = dict(entry, frames=[])
            kept.append(entry)
        out["entries"] = kept[::-1]
    config = trace.get("pg_config")
    if isinstance(config, dict):
        out["pg_config"] = {name: _hashed_members(group) for name, group in config.items()}
    return out


def _hashed_members(group: Any) -> Any:
    if not isinstance(group, dict) or not isinstance(group.get("ranks"), str):
        return group
    ranks = group["ranks"]
    if ranks.count(",") + 1 <= MAX_LISTED_MEMBERS:
        return group
    return dict(group, ranks=members_hash(ranks))


def restore_members(trace: dict[str, Any], known: dict[str, str]) -> dict[str, Any]:
    """Put back the member lists a digest replaced by their hash; ``known`` maps a hash to the
    member list (as torch writes it) from the summarizing rank's own dump. A list it does not
    know stays a hash: the analyzer then takes that group's members from the dumps it has."""
    config = trace.get("pg_config")
    if not isinstance(config, dict):
        return trace
    restored = {}
    for name, group in config.items():
        ranks = group.get("ranks") if isinstance(group, dict) else None
        if isinstance(ranks, str) and ranks.startswith(HASHED_MEMBERS_PREFIX):
            group = dict(group, ranks=known.get(ranks, "[]"))
        restored[name] = group
    return dict(trace, pg_config=restored)


def known_members(traces: list[dict[str, Any]]) -> dict[str, str]:
    """Hash -> member list over every group these (full) traces declare."""
    out: dict[str, str] = {}
    for trace in traces:
        config = trace.get("pg_config") if isinstance(trace, dict) else None
        for group in (config.values() if isinstance(config, dict) else ()):
            if isinstance(group, dict) and isinstance(group.get("ranks"), str):
                out[members_hash(group["ranks"])] = group["ranks"]
    return out


def main_thread_stack(text: str) -> str:
    """The ``MainThread`` section of a stacks file (its first ``MAX_STACKS_CHARS`` characters)."""
    start = text.find("--- thread 'MainThread'")
    if start < 0:
        return text[:MAX_STACKS_CHARS]
    end = text.find("\n--- thread ", start + 1)
    return text[start:end if end >= 0 else len(text)][:MAX_STACKS_CHARS]


def digest_files(files: list[Path]) -> dict[str, bytes]:
    """File name -> the digest's bytes of that file, for one rank's dump files. A file that
    cannot be cut down is left out (the full dump stays on the rank's disk)."""
    out: dict[str, bytes] = {}
    for path in files:
        try:
            data = path.read_bytes()
            if path.name.endswith(TRACE_SUFFIX):
                out[path.name] = pickle.dumps(trim_trace(safe_loads(data)))
            elif path.name.endswith(CONTEXT_SUFFIX):
                context = json.loads(data)
                for key in _CONTEXT_FIELDS_LEFT_OUT:
                    context.pop(key, None)
                context["digest"] = True
                out[path.name] = json.dumps(context).encode()
            elif path.name.endswith(STACKS_SUFFIX):
                out[path.name] = main_thread_stack(data.decode("utf-8", errors="replace")).encode()
        except Exception:  # noqa: BLE001 - a digest is an optimization: never fail the event over it
            log.warning("could not make a digest of %s", path, exc_info=True)
    return out
