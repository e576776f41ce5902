"""``summary.json``'s per-rank part, bounded: ranks grouped by what they stand for.

At 16,384 ranks nearly every row says the same thing (``in all_reduce (seq 2000) ...``, the same
call site, the same last collectives; only times differ), and 16,384 full rows made a 63 MB file.
So a rank's row is written out only where it stands for something: every culprit's, and the first
rank of each class of ranks whose rows agree on state, detail, location and newest collective.
Every rank is still named, in its class (``rank_classes``). Small jobs keep every row.

Duck-typed over the rows (``rank``, ``state``, ``detail``, ``location``, ``timeline``,
``to_dict()``): the model imports this, not the other way round.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

FULL_TABLE_ROWS = 256
"""Up to this many rows, ``per_rank`` has every row."""
MAX_ROWS = 1000
"""Rows written beyond that: culprits first, then one per class."""
MAX_CLASSES = 1000
"""Classes listed one by one; the ranks of any further ones share one last class."""


def _key(row: Any) -> tuple:
    last = row.timeline[-1] if row.timeline else None
    newest = None if last is None else (last.group, last.seq, last.op, last.done)
    return row.state, row.detail, row.location, newest


def rank_classes(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """The rows grouped by what they say (state, detail, location, newest collective), fewest
    ranks first: ``{"state", "detail", "location", "newest", "count", "ranks"}``."""
    groups: dict[tuple, list[int]] = {}
    for row in rows:
        groups.setdefault(_key(row), []).append(row.rank)
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][0]))
    out = [_class(key, ranks) for key, ranks in ordered[:MAX_CLASSES]]
    rest = sorted(r for _, ranks in ordered[MAX_CLASSES:] for r in ranks)
    if rest:
        out.append({"state": None, "detail": f"{len(ordered) - MAX_CLASSES} more classes, not told apart here",
                    "location": None, "newest": None, "count": len(rest), "ranks": rest})
    return out


def _class(key: tuple, ranks: list[int]) -> dict[str, Any]:
    state, detail, location, newest = key
    last = None if newest is None else dict(zip(("group", "seq", "op", "done"), newest))
    return {"state": state, "detail": detail, "location": location, "newest": last, "count": len(ranks),
            "ranks": ranks}


def rows_to_write(rows: Sequence[Any], culprits: Iterable[int]) -> list[Any]:
    """Every row of a small job; else the culprits' rows and the first row of each class (at
    most :data:`MAX_ROWS`), in rank order."""
    if len(rows) <= FULL_TABLE_ROWS:
        return list(rows)
    wanted = set(culprits)
    chosen = {row.rank: row for row in rows if row.rank in wanted}
    if len(chosen) > MAX_ROWS:
        chosen = dict(sorted(chosen.items())[:MAX_ROWS])
    firsts: dict[tuple, Any] = {}
    for row in rows:
        firsts.setdefault(_key(row), row)
    for row in sorted(firsts.values(), key=lambda r: r.rank):
        if len(chosen) >= MAX_ROWS:
            break
        chosen.setdefault(row.rank, row)
    return [chosen[r] for r in sorted(chosen)]
