"""Arrival skew: which rank enters collectives last, and by how much (from ``time_created_ns``).

Times are wall-clock on each host, so skew between hosts includes clock offset; within one
host it is exact. Only the newest ``MAX_WINDOW`` sequence ids every rank holds are used.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Mapping

from lightning_ncclx.analysis.model import GroupRef, GroupTrack, Straggler

MAX_WINDOW = 2000
TOP = 5


def _percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return float(sorted_values[k])


def group_stragglers(group: GroupRef, tracks: Mapping[int, GroupTrack]) -> list[Straggler]:
    """Per rank lateness (ns behind the earliest rank) over the common window, worst first."""
    filled = {r: t for r, t in tracks.items() if t.seqs}
    if len(filled) < 2:
        return []
    lo = max(t.oldest_seq for t in filled.values())
    hi = min(t.newest_seq for t in filled.values())
    lo = max(lo, hi - MAX_WINDOW + 1)
    ranks = sorted(filled)
    columns = []
    for r in ranks:
        t = filled[r]
        a, b = bisect_left(t.seqs, lo), bisect_right(t.seqs, hi)
        if t.seqs[a:b] != tuple(range(lo, hi + 1)):
            return []  # gaps in sequence ids: cannot line the ranks up cheaply; skip this group
        columns.append(t.times_ns[a:b])
    late: list[list[int]] = [[] for _ in ranks]
    last_count = [0] * len(ranks)
    for row in zip(*columns):
        if 0 in row:
            continue
        first, worst = min(row), max(row)
        for i, t in enumerate(row):
            late[i].append(t - first)
        last_count[row.index(worst)] += 1
    out = []
    for i, r in enumerate(ranks):
        values = sorted(late[i])
        if not values:
            continue
        out.append(Straggler(group.lib, group.name, group.desc, r, _percentile(values, 0.5) / 1e6,
                             _percentile(values, 0.95) / 1e6, last_count[i] / len(values), len(values)))
    out.sort(key=lambda s: (-s.median_late_ms, -s.p95_late_ms, s.rank))
    return out[:TOP]
