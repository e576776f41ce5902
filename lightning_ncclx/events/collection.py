"""What the initiator knows about one event's collection, and ``collection.json`` that keeps it.

Example::

    result = CollectionResult(event, folder, world_size=8, dumped_ranks=[0], missing_ranks=[1, 2])
    write_collection(result)   # <folder>/collection.json; logged, never raised
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_ncclx.events.wire import Announcement, EventMeta
from lightning_ncclx.files import atomic_write_text
from lightning_ncclx.layout import COLLECTION_FILE

log = logging.getLogger(__name__)


@dataclass
class CollectionResult:
    event: EventMeta
    folder: Path
    world_size: int
    dumped_ranks: list[int]
    missing_ranks: list[int]
    gone_ranks: list[int] = field(default_factory=list)
    """Missing ranks whose process a rank on the same host found exited."""
    gone_exits: dict[int, dict] = field(default_factory=dict)
    """Gone rank -> how its process ended: ``{"signal": "SIGABRT" or None, "status": 134 or None,
    "known_from": how that is known or None, "found_gone_unix": when the initiator saw it gone,
    "peers_saw": {rank: exception} of ranks that dumped and lost their connection to a peer}``."""
    silent_ranks: dict[int, dict] = field(default_factory=dict)
    """Missing ranks of the initiator's own host whose process is alive: ``{"pid", "host", "state"}``
    (the ``/proc`` state letter)."""
    gathered: dict[int, str] = field(default_factory=dict)
    """Rank -> folder its files were written to after being pulled through the store."""
    gather: str = "none"
    """``full`` (every dump through the store), ``two_phase`` (digests, then the culprits' full
    dumps) or ``none``."""
    digest_only_ranks: list[int] = field(default_factory=list)
    """Two-phase gather: ranks summarized from their digest (their full dump stays on their host)."""
    refused: list[str] = field(default_factory=list)
    """Store values and packed members left out, with the reason (planted, corrupt, too big)."""
    verdict: str | None = None
    culprit_ranks: list[int] = field(default_factory=list)
    hang_kind: str | None = None
    """``summary.json``'s hang kind (None when the analysis failed): pass it to
    :func:`lightning_ncclx.config.exit_code_for` for the exit status."""
    restart_advice: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, str] = field(default_factory=dict)
    text: str | None = None
    summary: Any = None
    """The analyzer's ``Summary`` (to write the reports again when the event recovers)."""
    announced: dict[int, Announcement] = field(default_factory=dict)
    blobs_from: list[int] = field(default_factory=list)
    """Ranks whose full dump this gather read from the store (their keys go at close)."""
    recovery: dict[str, Any] | None = None
    """Set once the event recovered: ``{"recovered": true, "lasted_seconds": ...}``."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per step of the collection (``wait``, ``digests``, ``first_diagnosis``, ``full_dumps``,
    ``summary``: to ``summary.json``), in ``collection.json``."""
    digest_files: Any = None
    """Two-phase gather: the writer of the expanded digests' files while it is still writing."""
    reports_writer: Any = None
    """The reports after ``summary.json`` and the expanded digests' files while a thread of their
    own still writes them (:class:`~lightning_ncclx.events.gather.ReportsWriter`); wait for them
    with :func:`~lightning_ncclx.events.gather.finish_reports`."""
    in_memory: Any = None
    """Two-phase gather: the expanded digests as the analyzer reads them
    (:class:`~lightning_ncclx.events.first_diagnosis.FirstDiagnosis`), so that the summary does
    not read their files back; None when they must be read from disk."""


def collection_document(result: CollectionResult) -> dict[str, Any]:
    data = {
        "schema": "lightning-ncclx/collection/1",
        "event": result.event.name,
        "reason": result.event.reason,
        "initiator_rank": result.event.initiator,
        "world_size": result.world_size,
        "dumped_ranks": result.dumped_ranks,
        "missing_ranks": result.missing_ranks,
        "gone_ranks": result.gone_ranks,
        "gone_exits": {str(r): v for r, v in result.gone_exits.items()},
        "silent_ranks": {str(r): v for r, v in result.silent_ranks.items()},
        "gathered": {str(k): v for k, v in result.gathered.items()},
        "gather": result.gather,
        "digest_only_ranks": result.digest_only_ranks,
        "refused": result.refused[:200],
        "verdict": result.verdict,
        "culprit_ranks": result.culprit_ranks,
        "hang_kind": result.hang_kind,
        "restart_advice": result.restart_advice,
    }
    if result.timings:
        data["timings_seconds"] = {k: round(v, 3) for k, v in result.timings.items()}
    if result.recovery is not None:
        data["recovery"] = result.recovery
    return data


def document_text(document: dict[str, Any]) -> str:
    """``document`` as JSON, a line per top-level field (each value in one line: the C encoder,
    where ``indent`` takes the pure-Python one, 0.5 s for a 16,384-rank collection)."""
    if not document:
        return "{}"
    return "{\n" + ",\n".join(f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in document.items()) + "\n}"


def write_collection(result: CollectionResult) -> None:
    try:
        atomic_write_text(result.folder / COLLECTION_FILE, document_text(collection_document(result)))
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] writing %s failed", result.event.initiator, COLLECTION_FILE, exc_info=True)
