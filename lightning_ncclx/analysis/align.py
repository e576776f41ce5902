"""Align the ranks of one process group by ``collective_seq_id`` and find where they diverge.

Only the sequence window every rank still holds is compared (ring buffers wrap), but a rank
whose newest sequence id is behind the others' has still not entered the next collective.
Point-to-point entries are never part of this: they live in their own list.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, replace
from typing import Mapping

from lightning_ncclx.analysis.columns import freeze
from lightning_ncclx.analysis.model import GroupTrack, Sig


@dataclass(frozen=True)
class Divergence:
    """``kind``: ``mismatch`` (ranks disagree at ``seq``), ``behind`` (``culprits`` never entered
    ``seq``), ``in_flight`` (all entered ``seq``, not finished), ``healthy``."""

    kind: str
    seq: int
    majority: Sig | None
    sigs: Mapping[int, Sig | None]
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    confidence: str = "high"
    time_ns: int = 0
    unknown: tuple[int, ...] = ()
    """Members with no entry of this group while the others' window starts after its first
    collective: their ring buffer wrapped past it (or their recorder is off); not compared."""


def _window(track: GroupTrack, lo: int, hi: int) -> tuple[int, int]:
    return bisect_left(track.seqs, lo), bisect_right(track.seqs, hi)


def sig_at(track: GroupTrack, seq: int) -> Sig | None:
    i = bisect_left(track.seqs, seq)
    return track.sig(i) if i < len(track.seqs) and track.seqs[i] == seq else None


def _index_at(track: GroupTrack, seq: int) -> int | None:
    i = bisect_left(track.seqs, seq)
    return i if i < len(track.seqs) and track.seqs[i] == seq else None


def first_mismatch(tracks: Mapping[int, GroupTrack], lo: int, hi: int, field: str = "sig_ids") -> int | None:
    """The first sequence id in [lo, hi] where any two ranks' ``field`` (signature ids, call
    sites) differ. Equal slices compare in C (arrays: memcmp); only differing ranks are walked
    in Python."""
    if hi < lo or len(tracks) < 2:
        return None
    slices = {}
    for rank, tr in tracks.items():
        a, b = _window(tr, lo, hi)
        slices[rank] = (tr.seqs[a:b], tr.callsites_between(a, b) if field == "callsites" else getattr(tr, field)[a:b])
    ref_seqs, ref_sigs = max(slices.values(), key=lambda s: len(s[0]))
    first: int | None = None
    for seqs, sigs in slices.values():
        if seqs == ref_seqs and sigs == ref_sigs:
            continue
        theirs = dict(zip(seqs, sigs))
        for s, sig in zip(ref_seqs, ref_sigs):
            if first is not None and s >= first:
                break
            if theirs.get(s) != sig:
                first = s
                break
    return first


def vote(sigs: Mapping[int, Sig | None]) -> tuple[Sig | None, tuple[int, ...], str]:
    """Majority signature, the ranks that differ from it, and a confidence. On a tie nobody is
    singled out: every rank is returned with confidence ``low``."""
    frozen = {r: freeze(s) for r, s in sigs.items()}
    counts = Counter(frozen.values()).most_common()
    top, n = counts[0]
    if len(counts) > 1 and counts[1][1] == n:
        return None, tuple(sorted(sigs)), "low"
    odd = tuple(sorted(r for r, s in frozen.items() if s != top))
    majority = next(sigs[r] for r, s in frozen.items() if s == top)
    return majority, odd, "high"


def diverge(tracks: Mapping[int, GroupTrack]) -> Divergence:
    """Where the dumped members of one group (``tracks``: global rank -> track) first diverge."""
    filled = [t for t in tracks.values() if t.seqs]
    if not filled:
        return Divergence("healthy", 0, None, {}, (), ())
    lo = max(t.oldest_seq for t in filled)
    # An empty track is "never entered seq 1" only while the others still hold seq 1: the
    # members of a collective all enter it, so others past it means this rank's entries were
    # evicted by its other groups' (the ring buffer is shared), not that it never came.
    first_held = min(t.oldest_seq for t in filled)
    unknown = tuple(sorted(r for r, t in tracks.items() if not t.seqs and first_held > 1))
    if unknown:
        return replace(diverge({r: t for r, t in tracks.items() if r not in unknown}), unknown=unknown)
    newest = {r: t.newest_seq for r, t in tracks.items()}
    low_hi, top = min(newest.values()), max(newest.values())
    bad = first_mismatch(tracks, lo, low_hi)
    if bad is not None:
        sigs = {r: sig_at(t, bad) for r, t in tracks.items()}
        majority, odd, confidence = vote(sigs)
        waiting = tuple(sorted(r for r in tracks if r not in odd))
        return Divergence("mismatch", bad, majority, sigs, odd, waiting, confidence, time_at(tracks, bad))
    if top > low_hi and _unfinished_everywhere(tracks, low_hi):
        # Every rank entered ``low_hi`` and none finished it: that is where they hang. Ranks that
        # went on only enqueued more (NCCL collectives are asynchronous); the others are not
        # "behind", they wait for ``low_hi`` like everyone.
        sig = next(t.sig(i) for t in tracks.values() if (i := _index_at(t, low_hi)) is not None)
        return Divergence("in_flight", low_hi, sig, {r: sig for r in tracks}, (), tuple(sorted(tracks)),
                          "high", time_at(tracks, low_hi))
    if top > low_hi:
        seq = low_hi + 1
        behind = tuple(sorted(r for r, n in newest.items() if n == low_hi))
        ahead = tuple(sorted(r for r, n in newest.items() if n > low_hi))
        sigs = {r: sig_at(t, seq) for r, t in tracks.items()}
        majority = next((s for s in sigs.values() if s is not None), None)
        # None: the others' windows start after ``seq``, which they cannot have passed without
        # the ranks behind: the group's membership or the dumps disagree with each other.
        confidence = "low" if majority is None else ("high" if len(behind) < len(ahead) else "medium")
        return Divergence("behind", seq, majority, sigs, behind, ahead, confidence, time_at(tracks, seq))
    last = {r: bool(t.done[-1]) for r, t in tracks.items() if t.seqs}
    sig = filled[0].sig(-1)
    if all(last.values()):
        return Divergence("healthy", top, sig, {}, (), ())
    return Divergence("in_flight", top, sig, {r: sig for r in tracks}, (), tuple(sorted(tracks)),
                      "high", time_at(tracks, top))


def _unfinished_everywhere(tracks: Mapping[int, GroupTrack], seq: int) -> bool:
    """Every rank holds ``seq`` and none has finished it."""
    for t in tracks.values():
        i = _index_at(t, seq)
        if i is None or t.done[i]:
            return False
    return True


def time_at(tracks: Mapping[int, GroupTrack], seq: int) -> int:
    times = []
    for t in tracks.values():
        i = _index_at(t, seq)
        if i is not None and t.times_ns[i]:
            times.append(t.times_ns[i])
    return min(times) if times else 0


def callsite_divergence(tracks: Mapping[int, GroupTrack]) -> tuple[int, dict[int, str | None]] | None:
    """The first sequence id (in the common window) where ranks' user call sites differ, with
    each rank's call site there; None without frames or when they agree."""
    filled = {r: t for r, t in tracks.items() if t.seqs and any(t.callsite_tail)}
    if len(filled) < 2:
        return None
    # Compared only where every rank kept call sites (the newest slots of each): ranks whose
    # tails start at different sequence ids would otherwise "differ" by a missing site.
    lo = max(t.seqs[len(t.seqs) - len(t.callsite_tail)] for t in filled.values())
    hi = min(t.newest_seq for t in filled.values())
    seq = first_mismatch(filled, lo, hi, field="callsites")
    if seq is None:
        return None
    sites = {}
    for r, t in filled.items():
        i = _index_at(t, seq)
        sites[r] = t.callsite(i) if i is not None else None
    return seq, sites
