"""Root cause by program order, where no majority can say it.

Healthy ranks repeat a per-step pattern of calls (groups, ops, sizes, call sites). When ranks
disagree and no vote settles it (a tie, one of three ranks died without a dump, or two groups
waiting on each other), the rank to blame is the one whose own sequence departs from the pattern
it repeated so far: it skipped a collective, called an extra one or entered two groups in a
different order. The ranks it left waiting keep their pattern. Pure functions over tracks.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Hashable, Mapping, Sequence

from lightning_ncclx.analysis.model import GroupTrack, RankTrace

MAX_PERIOD = 16
HISTORY = 64
"""Newest calls per group looked at: enough for a period, cheap at any size."""


def period_of(history: Sequence[Hashable]) -> int | None:
    """The shortest period ``k`` (``<= MAX_PERIOD``) the end of ``history`` repeats at least twice
    over (``history[i] == history[i - k]`` for its last ``max(2k, 4)`` items); None without one."""
    for k in range(1, MAX_PERIOD + 1):
        span = max(2 * k, 4)
        if len(history) < span:
            return None
        tail = history[-span:]
        if all(tail[i] == tail[i - k] for i in range(k, span)):
            return k
    return None


def breaks_period(labels: Sequence[Hashable]) -> tuple[bool, Hashable | None] | None:
    """Whether the last label departs from the period of the ones before it, with the label the
    period expected there; None when the history shows no period."""
    if len(labels) < 2:
        return None
    history, last = labels[:-1], labels[-1]
    k = period_of(history)
    if k is None:
        return None
    expected = history[-k]
    return last != expected, expected


def group_labels(track: GroupTrack, seq: int) -> list[tuple]:
    """(signature id, call site) of the newest ``HISTORY`` slots up to the slot of ``seq``; []
    when the track does not hold ``seq``."""
    i = bisect_left(track.seqs, seq)
    if i >= len(track.seqs) or track.seqs[i] != seq:
        return []
    sites = track.callsites
    return [(track.sig_ids[j], sites[j]) for j in range(max(0, i + 1 - HISTORY), i + 1)]


def period_breakers(tracks: Mapping[int, GroupTrack], seq: int) -> dict[int, tuple]:
    """Of ``tracks`` (rank -> its track of one group), the ranks whose call at ``seq`` breaks the
    period of their own earlier calls in that group: rank -> (label expected, label called)."""
    out = {}
    for rank, track in tracks.items():
        labels = group_labels(track, seq)
        verdict = breaks_period(labels) if labels else None
        if verdict is not None and verdict[0]:
            out[rank] = (verdict[1], labels[-1])
    return out


def keeps_period(track: GroupTrack, seq: int) -> bool:
    """The call at ``seq`` repeats the period of the calls before it (False without a period)."""
    labels = group_labels(track, seq)
    verdict = breaks_period(labels) if labels else None
    return verdict is not None and not verdict[0]


def program(trace: RankTrace) -> list[tuple[int, str, str, int]]:
    """One rank's collectives across its groups in call order: (time_ns, group, op, seq) of the
    newest ``HISTORY`` slots of each group, sorted by creation time (then group, seq)."""
    calls = []
    for name, track in trace.groups.items():
        for i in range(max(0, len(track.seqs) - HISTORY), len(track.seqs)):
            calls.append((track.times_ns[i], name, track.sig(i)[0], track.seqs[i]))
    calls.sort()
    return calls


def departs_from_own_order(trace: RankTrace) -> tuple[tuple[str, str], tuple[str, str], int, int] | None:
    """Whether a rank's newest call (across groups) breaks the group/op pattern its earlier calls
    repeat: ((group, op) expected, (group, op) called, seq called, time_ns called); None if it
    keeps the pattern or has none."""
    calls = program(trace)
    labels = [(group, op) for _, group, op, _ in calls]
    verdict = breaks_period(labels)
    if verdict is None or not verdict[0]:
        return None
    time_ns, group, op, seq = calls[-1]
    return verdict[1], (group, op), seq, time_ns
