"""A ``store-lost-NNN`` folder as an incident for ``lightning-ncclx history``.

When the job's store died with its host (rank 0's process aborted, OOM-killed, its node lost),
each surviving rank wrote its own dump into ``<dump_dir>/store-lost-NNN/`` with a note of why
(``store_lost`` in its context), and nobody summarized the event. What such a folder tells without
an analysis: the ranks that wrote, the ranks that did not (the store's host among them), when,
and what the writers saw. Where ``lightning-ncclx summarize`` was later run over the folder and
its JSON written there (``summary.json``), that summary's kind, verdict and culprits are the
incident's, the facts above kept beside them.

Every context file is read as ``summarize`` reads a side file (a regular file only, size capped)
and every field used is type-checked; a file that does not check counts as no writer.

Example::

    incident = store_lost_incident(Path("ncclx_dumps/store-lost-001"), summarized=None)
    incident.dumped_ranks, incident.missing_ranks   # (1, 2), (0,)
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lightning_ncclx.analysis.members import MAX_RANK
from lightning_ncclx.analysis.safe_read import MAX_SIDE_FILE_BYTES, read_regular
from lightning_ncclx.errors import DumpReadError
from lightning_ncclx.report.incident_file import MAX_TEXT_CHARS, Incident

STORE_LOST_KIND = "store_lost"
"""The kind of a store-lost folder that nobody summarized: the evidence is there, no verdict."""
_FOLDER = re.compile(r"store-lost-\d{3,9}")
_CONTEXT = re.compile(r"rank_(\d{1,9})\.context\.json")
MAX_CONTEXTS = 4096
MAX_SEEN_CHARS = 200


def is_store_lost_folder(folder: Path) -> bool:
    return bool(_FOLDER.fullmatch(folder.name))


def store_lost_incident(folder: Path, summarized: Incident | None) -> Incident | None:
    """The incident of ``folder`` (``summarized``: its own summary.json read, if any); None when
    no rank's context there checks and there is no summary."""
    writers = _writers(folder)
    if not writers and summarized is None:
        return None
    wrote = tuple(sorted(writers))
    sizes = [c["world_size"] for c in writers.values() if c.get("world_size")]
    world = min(max(sizes, default=(max(wrote) + 1) if wrote else 0), MAX_RANK)
    missing = tuple(r for r in range(world) if r not in writers)
    times = [c["time_unix"] for c in writers.values() if c.get("time_unix")]
    seen = next((c["seen"] for _, c in sorted(writers.items()) if c.get("seen")), None)
    facts = {"store_lost": True, "dumped_ranks": wrote, "missing_ranks": missing, "store_lost_seen": seen}
    if summarized is not None:
        return replace(summarized, **facts)
    parent = folder.absolute().parent
    run = parent.parent if parent.name == "ncclx_dumps" else parent
    return Incident(folder=str(folder), event=folder.name, run_id=run.name[:MAX_TEXT_CHARS], job_id=None,
                    time=_iso(min(times)) if times else _mtime(folder), kind=STORE_LOST_KIND,
                    verdict=STORE_LOST_KIND, culprit_ranks=(), culprit_hosts=(), call_site=None, op=None, **facts)


def _writers(folder: Path) -> dict[int, dict[str, Any]]:
    """rank -> the checked fields of its context file, for the ranks whose file checks."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return out
    for name in names:
        match = _CONTEXT.fullmatch(name)
        if match is None or len(out) >= MAX_CONTEXTS:
            continue
        try:
            ctx = json.loads(read_regular(folder / name, MAX_SIDE_FILE_BYTES, "context"))
        except (DumpReadError, ValueError, RecursionError):
            continue
        rank = int(match[1])
        if not isinstance(ctx, dict) or ctx.get("rank") != rank or rank >= MAX_RANK:
            continue
        world = ctx.get("world_size")
        when = ctx.get("time_unix")
        note = ctx.get("store_lost")
        out[rank] = {
            "world_size": world if _is_int(world) and rank < world <= MAX_RANK else None,
            "time_unix": float(when) if isinstance(when, (int, float)) and not isinstance(when, bool)
            and 0 < when < 1e11 else None,
            "seen": _seen(note) if isinstance(note, str) else None,
        }
    return out


def _seen(note: str) -> str:
    """What a writer saw, from its note: ``the job's store could not be reached (<why>) after this
    rank raised <exception>: ...`` -> the exception's first words, else the why."""
    raised = note.split(" after this rank raised ", 1)
    text = raised[1] if len(raised) == 2 else note.removeprefix("the job's store could not be reached ")
    text = text.split(": rank ", 1)[0]
    return text if len(text) <= MAX_SEEN_CHARS else text[:MAX_SEEN_CHARS - 1] + "…"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="seconds")


def _mtime(path: Path) -> str | None:
    try:
        return _iso(path.stat().st_mtime)
    except (OSError, ValueError, OverflowError):
        return None
