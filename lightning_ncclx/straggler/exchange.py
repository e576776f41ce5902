"""The store side of straggler detection: O(ranks) small keys per interval, no collective.

Keys (under the job store's ``lightning_ncclx/`` prefix, see ``dump.coordinator.open_job_store``):

``straggler/<fit>/<interval>/<rank>``  one rank's ``IntervalSummary`` as compact JSON
``straggler/<fit>/<interval>/n``       counter of ranks that wrote theirs (``add``)

``<fit>`` counts the fits of this process (every rank runs the same sequence), so a second
``trainer.fit`` never reads the first one's keys. Only non-blocking calls are used by the
reader (``add(key, 0)`` and ``check`` before ``get``); it deletes an interval's keys once read.
"""

from __future__ import annotations

import json
from typing import Any

from lightning_ncclx.straggler.timings import IntervalSummary


def _base(fit: int, interval: int) -> str:
    return f"straggler/{fit}/{interval}"


def publish(store: Any, fit: int, summary: IntervalSummary) -> None:
    base = _base(fit, summary.interval)
    store.set(f"{base}/{summary.rank}", json.dumps(summary.to_compact(), separators=(",", ":")))
    store.add(f"{base}/n", 1)


def arrived(store: Any, fit: int, interval: int) -> int:
    """How many ranks have published ``interval`` (0 when none has)."""
    return int(store.add(f"{_base(fit, interval)}/n", 0))


def collect(store: Any, fit: int, interval: int, world_size: int) -> list[IntervalSummary]:
    """Read and delete the summaries that are there; a rank that has not published is left out."""
    base = _base(fit, interval)
    found = []
    for rank in range(world_size):
        key = f"{base}/{rank}"
        if store.check([key]):
            found.append(IntervalSummary.from_compact(json.loads(store.get(key))))
            store.delete_key(key)
    store.delete_key(f"{base}/n")
    return found
