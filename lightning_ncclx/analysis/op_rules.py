"""Each collective's own rules, checked on one signature even when every rank recorded the same
call (torch's analyzer checks these in ``Op.match``): all_reduce gives back what it took,
all_gather multiplies by the group size, reduce_scatter divides by it; coalesced blocks entry by
entry. A broken rule is a size_mismatch that names it."""

from __future__ import annotations

from bisect import bisect_left
from math import prod
from typing import Any, Mapping

from lightning_ncclx.analysis.align import time_at, sig_at
from lightning_ncclx.analysis.columns import sig_id
from lightning_ncclx.analysis.model import CulpritState, Finding, GroupRef, GroupTrack, Sig, Verdict
from lightning_ncclx.analysis.wording import group_label as _group_label
from lightning_ncclx.analysis.wording import ranks_text as _ranks
from lightning_ncclx.analysis.wording import short as _short

ALL_REDUCE = frozenset({"all_reduce", "allreduce", "all_reduce_coalesced", "allreduce_coalesced"})
ALL_GATHER = frozenset({"all_gather", "_all_gather_base", "all_gather_into_tensor", "allgather",
                        "allgather_into_tensor", "all_gather_into_tensor_coalesced"})
REDUCE_SCATTER = frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"})


def _numel(shape: Any) -> int | None:
    if isinstance(shape, int):
        return shape
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        return prod(shape)
    return None


def _total(sizes: tuple) -> int | None:
    counts = [_numel(s) for s in sizes]
    return None if any(c is None for c in counts) else sum(counts)


def rule_broken(sig: Sig, group_size: int | None) -> str | None:
    """The rule ``sig`` breaks, in words, or None. ``group_size`` None (membership unknown):
    only the rules that do not need it are checked."""
    op, in_sizes, in_dtypes, out_sizes, out_dtypes = sig
    if not in_sizes or not out_sizes:
        return None  # not recorded (or left out on purpose: see columns.canonical_sig)
    if op in ALL_REDUCE:
        if in_sizes != out_sizes:
            return "all_reduce output sizes must equal its input sizes"
        if in_dtypes and out_dtypes and in_dtypes != out_dtypes:
            return "all_reduce output dtypes must equal its input dtypes"
        return None
    if group_size is None or group_size < 1:
        return None
    if op in ALL_GATHER:
        return _scaled(in_sizes, out_sizes, group_size, "all_gather", "output", "input")
    if op in REDUCE_SCATTER:
        return _scaled(out_sizes, in_sizes, group_size, "reduce_scatter", "input", "output")
    return None


def _scaled(small: tuple, big: tuple, n: int, op: str, big_name: str, small_name: str) -> str | None:
    """``big`` must hold ``n`` times the elements of ``small``: flat (one tensor) or as a list of
    ``n`` tensors per input; several inputs (coalesced) entry by entry."""
    if len(small) > 1 and len(big) == len(small):  # coalesced: one output per input
        for s, b in zip(small, big):
            ns, nb = _numel(s), _numel(b)
            if ns is not None and nb is not None and nb != ns * n:
                return f"{op} {big_name} element count must be {small_name} count x group size ({n})"
        return None
    ns, nb = _total(small), _total(big)
    if ns is None or nb is None:
        return None
    if len(big) > 1 and len(small) == 1 and len(big) != n:
        return f"{op} {big_name} list must hold one tensor per rank ({n}), not {len(big)}"
    if nb != ns * n:
        return f"{op} {big_name} element count must be {small_name} count x group size ({ns} x {n} = {ns * n}, not {nb})"
    return None


def rule_finding(group: GroupRef, tracks: Mapping[int, GroupTrack], states: Mapping[int, CulpritState]
                 ) -> Finding | None:
    """The first collective of ``group`` whose recorded sizes break the op's own rule
    (:mod:`op_rules`), on any rank: a size_mismatch even when every rank recorded the same."""
    size = len(group.ranks) if group.membership_known else None
    broken: dict[int, str] = {}
    for t in tracks.values():
        for sid, sig in t.sig_table.items():
            if sid not in broken:
                broken[sid] = rule_broken(sig, size) or ""
    bad = {sid for sid, rule in broken.items() if rule}
    if not bad:
        return None
    first: tuple[int, int] | None = None
    lo = max((t.oldest_seq for t in tracks.values() if t.seqs), default=0)  # the window every rank holds
    for t in tracks.values():
        start = bisect_left(t.seqs, lo)
        for sid in bad & t.sig_table.keys():
            try:
                seq = t.seqs[t.sig_ids.index(sid, start)]
            except ValueError:
                continue
            if first is None or seq < first[0]:
                first = (seq, sid)
    if first is None:
        return None
    seq, sid = first
    sigs = {r: sig_at(t, seq) for r, t in tracks.items()}
    culprits = tuple(sorted(r for r, sig in sigs.items() if sig is not None and broken.get(sig_id(sig))))
    sig = next(sig for r, sig in sigs.items() if r in culprits)
    waiting = tuple(sorted(r for r in tracks if r not in culprits))
    msg = (f"size_mismatch: {sig[0]} at seq {seq} of {_group_label(group)} breaks its rule: {broken[sid]} "
           f"(rank(s) {_ranks(culprits)} recorded {_short(sig)})")
    return Finding(Verdict.SIZE_MISMATCH, culprits, group, seq, sig[0], None, {r: sigs[r] for r in culprits},
                   waiting, tuple(states[r] for r in culprits if r in states), msg,
                   "medium" if not waiting else "high", time_at(tracks, seq))
