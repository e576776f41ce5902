"""Arrival skew: which rank enters collectives last, and by how much (from ``time_created_ns``).

Times are wall-clock on each host, so skew between hosts includes clock offset; within one
host it is exact. Only the newest sequence ids every rank holds are used: ``MAX_WINDOW`` of them,
fewer in big groups so ranks x window stays near ``MAX_CELLS`` (16,384 ranks: the newest 128, still
a median and p95 over 128 collectives per rank).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from heapq import nsmallest
from itertools import compress
from operator import sub
from typing import Mapping

from lightning_ncclx.analysis.model import GroupRef, GroupTrack, Straggler

MAX_WINDOW = 2000
MIN_WINDOW = 128
MAX_CELLS = 2_100_000
TOP = 5


def _rank_of(n: int, q: float) -> int:
    """The index of the ``q`` quantile in ``n`` sorted values (nearest rank)."""
    return min(n - 1, max(0, int(round(q * (n - 1)))))


def group_stragglers(group: GroupRef, tracks: Mapping[int, GroupTrack]) -> list[Straggler]:
    """Per rank lateness (ns behind the earliest rank) over the common window, worst first.
    Column-wise: per-collective min/max over ranks and per-rank differences run in C."""
    filled = {r: t for r, t in tracks.items() if t.seqs}
    if len(filled) < 2:
        return []
    lo = max(t.oldest_seq for t in filled.values())
    hi = min(t.newest_seq for t in filled.values())
    window = min(MAX_WINDOW, max(MIN_WINDOW, MAX_CELLS // len(filled)))
    lo = max(lo, hi - window + 1)
    ranks = sorted(filled)
    want = array("q", range(lo, hi + 1))
    columns = []
    for r in ranks:
        t = filled[r]
        a, b = bisect_left(t.seqs, lo), bisect_right(t.seqs, hi)
        if array("q", t.seqs[a:b]) != want:
            return []  # gaps in sequence ids: cannot line the ranks up cheaply; skip this group
        columns.append(t.times_ns[a:b])
    # One pass over the collectives (each row of times lives only while it is looked at: 16,384
    # ranks x 128 collectives held at once would be ~100 MB of int objects), one per rank.
    keep, firsts, worst_at = [], [], []
    for row in zip(*columns):
        kept = 0 not in row  # a rank without a creation time: skip the collective
        keep.append(kept)
        if kept:
            firsts.append(min(row))
            worst_at.append(row.index(max(row)))
    if not firsts:
        return []
    last_count = Counter(worst_at)
    n = len(firsts)  # every rank has one value per kept collective
    at_median, at_p95 = _rank_of(n, 0.5), _rank_of(n, 0.95)
    ranked = []
    for i, r in enumerate(ranks):
        values = sorted(map(sub, compress(columns[i], keep), firsts))
        ranked.append((-values[at_median], -values[at_p95], r, i))
    return [Straggler(group.lib, group.name, group.desc, r, -median / 1e6, -p95 / 1e6, last_count[i] / n, n)
            for median, p95, r, i in nsmallest(TOP, ranked)]
