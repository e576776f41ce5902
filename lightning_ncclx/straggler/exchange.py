"""The store side of straggler detection: O(ranks) small keys per interval, no collective.

Keys (under the plugin's ``lightning_ncclx/`` prefix, through the connection the watchdog shares,
``lightning_ncclx.events.connection.shared_client``):

``straggler/<fit>/<interval>/<rank>``  one rank's ``IntervalSummary`` as compact JSON
``straggler/<fit>/<interval>/n``       roster of the ranks that wrote theirs (one line each, appended)

``<fit>`` counts the fits of this process (every rank runs the same sequence), so a second
``trainer.fit`` never reads the first one's keys. The reader only uses requests that never wait
(non-blocking reads), checks every value (another store client may have
written it: it must name the rank of its key, with finite, non-negative seconds) and deletes an
interval's keys once read.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from lightning_ncclx.events.wire import parse_rank_lines
from lightning_ncclx.straggler.timings import IntervalSummary

log = logging.getLogger(__name__)

MAX_SUMMARY_BYTES = 16 * 1024
MAX_PARTS = 32
DEFAULT_WORLD = 1 << 20


def _base(fit: int, interval: int) -> str:
    return f"straggler/{fit}/{interval}"


def publish(store: Any, fit: int, summary: IntervalSummary) -> None:
    base = _base(fit, summary.interval)
    store.set(f"{base}/{summary.rank}", json.dumps(summary.to_compact(), separators=(",", ":")))
    store.append(f"{base}/n", f"{summary.rank}\n")  # never ``add``: on a planted value it costs the connection


def arrived(store: Any, fit: int, interval: int, world_size: int = DEFAULT_WORLD) -> int:
    """How many ranks of ``world_size`` have published ``interval`` (lines another client
    planted in the roster are not counted)."""
    ranks, _ = parse_rank_lines(store.read(f"{_base(fit, interval)}/n"), world_size, "straggler roster")
    return len(ranks)


def collect(store: Any, fit: int, interval: int, world_size: int) -> list[IntervalSummary]:
    """Read and delete the summaries that are there; a rank that has not published, or whose
    value is not a summary of that rank and interval, is left out."""
    base = _base(fit, interval)
    keys = [f"{base}/{rank}" for rank in range(world_size)]
    found = []
    for rank, (key, raw) in enumerate(zip(keys, store.multi_get(keys))):
        if not raw:
            continue
        summary = parse_summary(raw, rank, interval)
        if summary is not None:
            found.append(summary)
        store.delete_key(key)
    store.delete_key(f"{base}/n")
    return found


def parse_summary(raw: bytes, rank: int, interval: int) -> IntervalSummary | None:
    """One rank's summary, or None (logged) when it is not what :func:`publish` writes."""
    try:
        if len(raw) > MAX_SUMMARY_BYTES:
            raise ValueError(f"{len(raw)} bytes")
        data = json.loads(raw)
        summary = IntervalSummary.from_compact(data)
        parts = summary.parts
        if (summary.rank != rank or summary.interval != interval or not 0 <= summary.batches < 1 << 31
                or len(parts) > MAX_PARTS or len(summary.host) > 256
                or not all(math.isfinite(v) and 0.0 <= v < 1e9 for v in parts.values())):
            raise ValueError("fields out of range")
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError, RecursionError) as error:
        log.warning("straggler: rank %d's summary of interval %d refused (%s)", rank, interval,
                    str(error)[:120])
        return None
    return summary
