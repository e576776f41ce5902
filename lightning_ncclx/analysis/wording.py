"""How findings name ranks, groups and calls in their messages (shared by every finding builder)."""

from __future__ import annotations

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


def group_label(g: GroupRef) -> str:
    return f"group {g.name} ({g.desc or 'no desc'}, {g.lib})"
