"""How findings and every report form name ranks, groups and calls (one wording for all of them)."""

from __future__ import annotations

from collections.abc import Iterable

from lightning_ncclx.analysis.model import GroupRef, Sig


def sizes_text(sizes: tuple) -> str:
    return ",".join("x".join(map(str, x)) if isinstance(x, tuple) else str(x) for x in sizes)


def short(sig: Sig | None) -> str:
    """``op[in sizes->out sizes]/in dtypes->out dtypes``; outputs only where they differ."""
    if sig is None:
        return "nothing"
    op, in_sizes, in_dtypes, out_sizes, out_dtypes = sig
    sizes = sizes_text(in_sizes)
    if out_sizes and out_sizes != in_sizes:
        sizes = f"{sizes or '-'}->{sizes_text(out_sizes)}"
    dtypes = ",".join(in_dtypes)
    if out_dtypes and out_dtypes != in_dtypes:
        dtypes = f"{dtypes or '-'}->{','.join(out_dtypes)}"
    return f"{op}[{sizes or '-'}]{'/' + dtypes if dtypes else ''}"


def ranks_text(r: tuple[int, ...]) -> str:
    return ", ".join(map(str, r)) if len(r) <= 12 else f"{', '.join(map(str, r[:10]))}, ... ({len(r)} ranks)"


def rank_runs(ranks: Iterable[int]) -> list[str]:
    """``["0-2", "5", "7-8"]``: runs of consecutive ranks, in order."""
    runs: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        runs.append(str(start) if start == prev else f"{start}-{prev}")
    return runs


def ranks_label(ranks: Iterable[int], most_runs: int = 4) -> str:
    """What a set of ranks stands for, short: ``rank 3``, ``ranks 0-699, 701-1023``, or, past
    ``most_runs`` runs, ``128 ranks: 0, 8, 16, ..., 1016``."""
    members = sorted(set(ranks))
    runs = rank_runs(members)
    if len(members) == 1:
        return f"rank {members[0]}"
    if len(runs) <= most_runs:
        return "ranks " + ", ".join(runs) if runs else "no ranks"
    return f"{len(members)} ranks: {', '.join(runs[:3])}, ..., {runs[-1]}"


UNNAMED_DESCS = frozenset({"", "undefined"})
"""Descriptions that name nothing: torch writes "undefined" for a group made without ``group_desc``."""


def group_title(desc: str, ranks: Iterable[int]) -> str:
    """How every report names a group: its description, or, where torch gave none, the ranks it
    stands for (``ranks 0-2``)."""
    if desc not in UNNAMED_DESCS:
        return desc
    members = tuple(ranks)
    return ranks_label(members) if members else "ranks unknown"


def group_label(g: GroupRef) -> str:
    """``group 5 (tp, nccl)``; ``group 1 (ranks 0-2, gloo)`` for a group torch calls "undefined"."""
    return f"group {g.name} ({group_title(g.desc, g.ranks)}, {g.lib})"
