"""``summary.json``'s per-rank parts, bounded: ranks grouped by what they stand for.

At 16,384 ranks nearly every row says the same thing (``in all_reduce (seq 2000) ...``, the same
call site, the same last collectives; only times differ), and 16,384 full rows made a 63 MB file.
So past :data:`FULL_TABLE_ROWS` a rank's row is written out only where it stands for something:
every culprit's, and the first rank of each class of ranks whose rows agree on everything but the
rank (``per_rank``: state, detail, location and newest collective; ``inputs``: folder, backend,
format, versions, entry count), at most :data:`MAX_ROWS` rows. Every rank is still named, in its
class (``rank_classes``, ``input_classes``), and every row is in the per-rank detail file
(``summary-ranks.json``). Small jobs keep every row.

Duck-typed over the rows (``RankRow``, ``InputFile``): the model imports this, not the other way.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Sequence

import lightning_ncclx.analysis.rank_sets as rank_sets

FULL_TABLE_ROWS = 256
"""Up to this many rows, a table has every row."""
MAX_ROWS = 64
"""Rows written beyond that: culprits first, then one per class (a row with its timeline is
about 2 KB: 64 keep ``summary.json`` of 16,384 ranks in 2,048 classes under 512 KiB)."""
MAX_CLASSES = 256
"""Classes listed one by one; the ranks of any further ones share one last class."""


def row_key(row: Any) -> tuple:
    """A ``per_rank`` row's class: state, detail, location and newest collective."""
    last = row.timeline[-1] if row.timeline else None
    newest = None if last is None else (last.group, last.seq, last.op, last.done)
    return row.state, row.detail, row.location, newest


def input_key(item: Any) -> tuple:
    """An ``inputs`` row's class: its folder, where its rank came from, backend, format, versions
    and number of entries."""
    return (os.path.dirname(item.path), item.rank_from, item.backend, item.fmt, item.version,
            item.comm_lib_version, item.entries)


def row_class(key: tuple) -> dict[str, Any]:
    state, detail, location, newest = key
    last = None if newest is None else dict(zip(("group", "seq", "op", "done"), newest))
    return {"state": state, "detail": detail, "location": location, "newest": last}


def input_class(key: tuple) -> dict[str, Any]:
    return dict(zip(("folder", "rank_from", "backend", "format", "version", "comm_lib_version", "entries"), key))


def classes(items: Sequence[Any], key: Callable[[Any], tuple], describe: Callable[[tuple], dict[str, Any]],
            ranges: bool = False, limit: int = MAX_CLASSES) -> list[dict[str, Any]]:
    """``items`` grouped by ``key``, fewest ranks first: ``describe(key)`` plus ``count`` and
    ``ranks`` (a rank set: :mod:`rank_sets`, ranges when ``ranges``). Past ``limit`` the rest
    share one class that only names its ranks."""
    groups: dict[tuple, list[int]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item.rank)
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][0]))
    out = [{**describe(k), "count": len(ranks), "ranks": rank_sets.encode(ranks, ranges)}
           for k, ranks in ordered[:limit]]
    rest = sorted(r for _, ranks in ordered[limit:] for r in ranks)
    if rest:
        out.append({"more_classes": len(ordered) - limit, "count": len(rest),
                    "ranks": rank_sets.encode(rest, ranges)})
    return out


def to_write(items: Sequence[Any], culprits: Iterable[int], key: Callable[[Any], tuple]) -> list[Any]:
    """Every item of a small table; else the culprits' and the first of each class (at most
    :data:`MAX_ROWS`), in their order."""
    if len(items) <= FULL_TABLE_ROWS:
        return list(items)
    wanted = set(culprits)
    chosen = [i for i, item in enumerate(items) if item.rank in wanted][:MAX_ROWS]
    firsts: dict[tuple, int] = {}
    for i, item in enumerate(items):
        firsts.setdefault(key(item), i)
    taken = set(chosen)
    for i in sorted(firsts.values()):
        if len(taken) >= MAX_ROWS:
            break
        taken.add(i)
    return [items[i] for i in sorted(taken)]
