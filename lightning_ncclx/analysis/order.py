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
from lightning_ncclx.analysis.wording import ranks_text

MAX_PERIOD = 16
HISTORY = 64
"""Newest calls per group looked at: enough for a period, cheap at any size."""
SAMPLE = 16
"""Ranks of each side whose own order :func:`skipped_into_next` reads (16,384 waiting ranks would
cost seconds; ranks of one side share their order)."""


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


def breaks_habit(labels: Sequence[Hashable]) -> tuple[bool, Hashable | None] | None:
    """Order-1 fallback for a history with no strict period (a warm-up barrier, DDP's bucket
    rebuild, an epoch boundary put extra calls between the steps): whether the last label ever
    followed the label before it in the rank's own history.

    ``(False, last)`` when that pair of calls occurred before; ``(True, expected)`` when it never
    did although both calls are familiar (the label before it was followed, and the last label
    preceded, at least twice before); ``expected`` is what usually followed the label before it,
    else what usually preceded the last label (the call a rank that skipped one left out), else
    None. None when the history is too short to tell."""
    if len(labels) < 3:
        return None
    history, last = labels[:-1], labels[-1]
    before = history[-1]
    pairs = list(zip(history, history[1:]))
    if (before, last) in pairs:
        return False, last
    after_before = [b for a, b in pairs if a == before]
    before_last = [a for a, b in pairs if b == last]
    if len(after_before) < 2 or len(before_last) < 2:
        return None
    expected = _most_frequent(after_before)
    return True, expected if expected is not None else _most_frequent(before_last)


def _most_frequent(items: Sequence[Hashable]) -> Hashable | None:
    """The one item that occurs most often; None on a tie."""
    counts: dict[Hashable, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    ranked = sorted(counts.values(), reverse=True)
    if not ranked or (len(ranked) > 1 and ranked[0] == ranked[1]):
        return None
    return next(item for item, n in counts.items() if n == ranked[0])


def group_labels(track: GroupTrack, seq: int) -> list[tuple]:
    """(signature id, call site) of the newest ``HISTORY`` slots up to the slot of ``seq``; []
    when the track does not hold ``seq``."""
    i = bisect_left(track.seqs, seq)
    if i >= len(track.seqs) or track.seqs[i] != seq:
        return []
    lo = max(0, i + 1 - HISTORY)
    return list(zip(track.sig_ids[lo:i + 1], track.callsites_between(lo, i + 1)))


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


def own_order(track: GroupTrack, seq: int) -> tuple[bool, tuple | None] | None:
    """Whether the call at ``seq`` leaves the rank's own order in the group: its strict period
    (:func:`breaks_period`) where the history has one, else its habit (:func:`breaks_habit`).
    ``(broke, label expected)``; None when neither can tell."""
    labels = group_labels(track, seq)
    if not labels:
        return None
    return breaks_period(labels) or breaks_habit(labels)


def skipped_into_next(tracks: Mapping[int, GroupTrack], culprits: tuple[int, ...], waiting: tuple[int, ...],
                      seq: int) -> tuple[tuple, tuple] | None:
    """Whether ``culprits``, whose call at ``seq`` differs from the ``waiting`` ranks' call there,
    skipped that call: each culprit's own history has it call the waiting ranks' call (signature
    and, where both are known, call site) right after the call it made before ``seq``, and its
    own call at ``seq`` right after that one (gloo and NCCL paired the next call it made with the
    one it skipped), while every waiting rank keeps its own order (the first :data:`SAMPLE` of
    each side are read). ((signature id, site) of the
    call skipped, (signature id, site) of the call made instead); None when the dumps cannot say."""
    if not culprits or not waiting:
        return None
    skipped = group_labels(tracks[waiting[0]], seq)[-1:] if waiting[0] in tracks else []
    if not skipped or any((v := own_order(tracks[w], seq)) is None or v[0]
                          for w in waiting[:SAMPLE] if w in tracks):
        return None
    want_sig, want_site = skipped[0]
    made = None
    for r in culprits[:SAMPLE]:
        labels = group_labels(tracks[r], seq) if r in tracks else []
        if len(labels) < 3:
            return None
        history, last = labels[:-1], labels[-1]
        pairs = set(zip(history, history[1:]))
        fits = [a for a in {a for a, _ in pairs} if a[0] == want_sig and (not want_site or not a[1]
                                                                         or a[1] == want_site)]
        if not any((history[-1], a) in pairs and (a, last) in pairs for a in fits):
            return None
        made = made or last
    return skipped[0], made


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


def _site_at(track: GroupTrack, seq: int) -> tuple[bool, str | None]:
    """(held, call site) of the slot of ``seq``."""
    i = bisect_left(track.seqs, seq)
    if i >= len(track.seqs) or track.seqs[i] != seq:
        return False, None
    tail = i - (len(track.seqs) - len(track.callsite_tail))
    return True, track.callsite_tail[tail] if tail >= 0 else None


def _sites_agree(tracks: Mapping[int, GroupTrack], seq: int) -> bool:
    """Every rank holds ``seq`` with a known call site, the same on all of them."""
    sites = set()
    for track in tracks.values():
        held, site = _site_at(track, seq)
        if not held or site is None:
            return False
        sites.add(site)
    return len(sites) == 1


def first_site_split(tracks: Mapping[int, GroupTrack], last_common: int) -> int | None:
    """The first sequence id up to ``last_common`` at which the ranks' call sites differ, where
    they agreed (known and equal) on the sequence id before it; None without such a point."""
    held = [t for t in tracks.values() if t.seqs]
    if len(held) < 2:
        return None
    lo = max(t.oldest_seq for t in held)
    for seq in range(max(lo + 1, last_common - HISTORY), last_common + 1):
        if not _sites_agree(tracks, seq) and _sites_agree(tracks, seq - 1):
            sites = {_site_at(t, seq) for t in tracks.values()}
            if all(held and site is not None for held, site in sites):
                return seq
    return None


def _deep_histories(tracks: Mapping[int, GroupTrack]) -> dict[int, GroupTrack]:
    """The tracks whose history reaches back about as far as the deepest one's (a digest of a
    two-phase gather, or a much smaller ring buffer, keeps only the newest few collectives)."""
    longest = max(len(t.seqs) for t in tracks.values())
    oldest = min(t.oldest_seq for t in tracks.values())
    return {r: t for r, t in tracks.items() if t.oldest_seq <= oldest + max(1, longest // 4)}


def extra_or_skipped(tracks: Mapping[int, GroupTrack], behind: tuple[int, ...], ahead: tuple[int, ...],
                     last_common: int) -> tuple[str, int, str, str] | None:
    """Who left the group's common order when ranks ``ahead`` hold more collectives than ranks
    ``behind`` (whose newest is ``last_common``). Where the call sites split at ``seq``:
    ``("extra", seq, why, "high")`` when the ranks ahead called a collective there that the others
    did not (their call breaks the period of their own earlier calls, the others' keeps it),
    ``("skipped", seq, why, "high")`` the other way round. Without a period, a minority ahead whose
    call site alone differs there is ``"extra"`` with confidence ``medium``. Ranks without call
    sites (JSON dumps, stack traces off), and where enough others remain, ranks that kept far
    fewer collectives (digests), are left out of the comparison; it needs at least one rank ahead
    and one behind with them. None when the dumps cannot tell."""
    sited = {r: t for r, t in tracks.items() if any(t.callsite_tail)}
    ahead_s = tuple(r for r in ahead if r in sited)
    behind_s = tuple(r for r in behind if r in sited)
    if not ahead_s or not behind_s:
        return None
    deep = _deep_histories(sited)  # a digest's few newest collectives have no say on the period
    if any(r in deep for r in ahead_s) and any(r in deep for r in behind_s):
        sited = deep
        ahead_s = tuple(r for r in ahead_s if r in deep)
        behind_s = tuple(r for r in behind_s if r in deep)
    seq = first_site_split(sited, last_common)
    if seq is None:
        return None
    breakers = period_breakers(sited, seq)
    keep = {r for r in sited if r not in breakers and keeps_period(sited[r], seq)}
    site = {r: _site_at(t, seq)[1] for r, t in sited.items()}
    for kind, broke, kept in (("extra", ahead_s, behind_s), ("skipped", behind_s, ahead_s)):
        if set(breakers) == set(broke) and keep == set(kept):
            expected = breakers[broke[0]][0][1] or "another call site"
            why = (f"rank(s) {ranks_text(broke)} broke the pattern of their own earlier steps there (a call from "
                   f"{site[broke[0]]} where their earlier steps called from {expected}) while rank(s) "
                   f"{ranks_text(kept)} kept theirs" + (": they skipped a collective" if kind == "skipped" else ""))
            return kind, seq, why, "high"
    if not breakers and len(ahead) < len(behind):
        ahead_sites = {site[r] for r in ahead_s}
        behind_sites = {site[r] for r in behind_s}
        if len(behind_sites) == 1 and not ahead_sites & behind_sites:
            why = (f"at seq {seq} rank(s) {ranks_text(ahead_s)} called from "
                   f"{', '.join(sorted(map(str, ahead_sites)))} while rank(s) {ranks_text(behind_s)} called from "
                   f"{behind_sites.pop()}")
            return "extra", seq, why, "medium"
    return None
