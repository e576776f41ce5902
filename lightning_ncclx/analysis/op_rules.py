"""Each collective's own rules, checked on one signature even when every rank recorded the same
call (torch's analyzer checks these in ``Op.match``): all_reduce gives back what it took,
all_gather multiplies by the group size, reduce_scatter divides by it; coalesced blocks entry by
entry. A broken rule is a size_mismatch that names it."""

from __future__ import annotations

from math import prod
from typing import Any

from lightning_ncclx.analysis.model import Sig

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
