"""Point-to-point: a send or recv still in flight whose peer has no matching op in flight.

Sends and recvs come from the recorders (NCCL records them) and, for gloo, which records none,
from context.json's ``p2p_in_flight`` (the watchdog's ProcessGroup hooks): :func:`with_context_p2p`
adds those to the rank's trace, as in-flight p2p entries and as the op the rank is in.

Completed send/recv pairs are never findings (torchfrtrace 2.13 and 2.15 crash on a recv written
``recv 0->1``; 2.13 also on any ``nccl2:`` entry: see docs/bench-analyzer.md). Peers in the
profiling name (``send 0->1``, ``recv 1<-0``, ``recv 0->1``) are group ranks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from lightning_ncclx.analysis.model import (CulpritState, Finding, GroupRef, OpenOp, P2POp, RankContext, RankTrace,
                                            Verdict)

MAX_CONTEXT_P2P = 64
"""Point-to-point ops read from one context.json (the watchdog writes at most 32)."""


def p2p_findings(by_lib: Mapping[str, Mapping[int, RankTrace]], groups: Mapping[tuple[str, str], GroupRef],
                 states: Mapping[int, CulpritState]) -> list[Finding]:
    """In-flight sends/recvs whose peer has no matching op in flight (not_entered), and matched
    in-flight pairs whose sizes or dtypes differ (size/dtype mismatch). A recv from any source
    (``?``) matches any send to its rank."""
    out = []
    for lib, traces in by_lib.items():
        for rank, trace in sorted(traces.items()):
            for op in trace.p2p:
                if op.done or op.dst < 0 or (op.op == "send" and op.src < 0):
                    continue
                if op.op == "recv" and op.src < 0:
                    continue  # any-source recv: nothing names the peer to blame
                group = groups.get((lib, op.group)) or _guess_group(lib, op.group, traces)
                members = group.ranks
                if max(op.src, op.dst) >= len(members):
                    continue
                peer = members[op.dst] if op.op == "send" else members[op.src]
                if peer == rank or peer not in traces:
                    continue
                want = "recv" if op.op == "send" else "send"
                match = next((p for p in traces[peer].p2p if _pairs(op, p, want)), None)
                if match is not None:
                    if op.op == "send":
                        out.extend(_pair_mismatch(op, match, rank, peer, group, lib, states))
                    continue
                msg = (f"not_entered: rank {peer} has no {want} in flight matching rank {rank}'s "
                       f"{op.op} {op.src}->{op.dst} (p2p seq {op.seq}) in group {group.name} ({group.desc}, {lib})")
                out.append(Finding(Verdict.NOT_ENTERED, (peer,), group, op.seq, op.op, None, {peer: None}, (rank,),
                                   (states[peer],) if peer in states else (), msg, "medium"))
    return out


def _pairs(op: P2POp, other: P2POp, want: str) -> bool:
    """``other`` (on the peer) is the in-flight counterpart of ``op``."""
    if other.group != op.group or other.op != want or other.done or other.dst != op.dst:
        return False
    return other.src == op.src or -1 in (other.src, op.src)


def _pair_mismatch(send: P2POp, recv: P2POp, sender: int, receiver: int, group: GroupRef, lib: str,
                   states: Mapping[int, CulpritState]) -> list[Finding]:
    if send.sizes and recv.sizes and send.sizes != recv.sizes:
        kind, what = Verdict.SIZE_MISMATCH, f"sizes {list(send.sizes)} vs {list(recv.sizes)}"
    elif send.dtypes and recv.dtypes and send.dtypes != recv.dtypes:
        kind, what = Verdict.DTYPE_MISMATCH, f"dtypes {list(send.dtypes)} vs {list(recv.dtypes)}"
    else:
        return []
    ranks = tuple(sorted((sender, receiver)))
    msg = (f"{kind.value}: rank {sender}'s send {send.src}->{send.dst} (p2p seq {send.seq}) and rank {receiver}'s "
           f"matching recv in group {group.name} ({group.desc}, {lib}) disagree: {what}")
    return [Finding(kind, ranks, group, send.seq, "send", None, {sender: None, receiver: None}, (),
                    tuple(states[r] for r in ranks if r in states), msg, "medium")]


def _guess_group(lib: str, name: str, traces: Mapping[int, RankTrace]) -> GroupRef:
    ranks = tuple(sorted(r for r, t in traces.items() if any(p.group == name for p in t.p2p)))
    return GroupRef(name, "", ranks, lib, membership_known=False)


def p2p_from_context(raw: Any) -> tuple[tuple[str, P2POp], ...]:
    """context.json's ``p2p_in_flight`` (untrusted) as (backend, in-flight op); malformed items
    are skipped, at most :data:`MAX_CONTEXT_P2P`."""
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw[:MAX_CONTEXT_P2P]:
        if not isinstance(item, dict) or item.get("op") not in ("send", "recv"):
            continue
        backend, group = item.get("backend"), item.get("group")
        src, dst, op_id = (_small_int(item.get(k)) for k in ("src", "dst", "op_id"))
        if not isinstance(backend, str) or not isinstance(group, (str, int)) or None in (src, dst, op_id):
            continue
        sizes = _sizes(item.get("sizes"))
        dtype = item.get("dtype")
        out.append((backend[:40], P2POp(str(group)[:200], item["op"], src, dst, op_id, False, sizes,
                                        (dtype[:40],) if isinstance(dtype, str) and dtype else ())))
    return tuple(out)


def _small_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and -1 <= value < 1 << 40 else None


def _sizes(raw: Any) -> tuple:
    if not isinstance(raw, list):
        return ()
    out = []
    for shape in raw[:8]:
        if not isinstance(shape, list) or len(shape) > 16 or not all(_small_int(d) is not None for d in shape):
            return ()
        out.append(tuple(shape))
    return tuple(out)


def with_context_p2p(traces: Sequence[RankTrace], contexts: Mapping[int, RankContext]) -> list[RankTrace]:
    """Each rank's trace of a backend, with the in-flight sends/recvs its context.json lists for
    that backend added as p2p entries and as open ops (where the rank is). Ops its recorder holds
    already (NCCL) are not added twice."""
    out = []
    for trace in traces:
        ctx = contexts.get(trace.rank)
        extra = [op for lib, op in (ctx.p2p_in_flight if ctx is not None else ()) if lib == trace.lib]
        known = {(p.group, p.op, p.src, p.dst) for p in trace.p2p if not p.done}
        extra = [op for op in extra if (op.group, op.op, op.src, op.dst) not in known]
        if not extra:
            out.append(trace)
            continue
        opened = tuple(OpenOp(trace.lib, op.group, _desc(trace, ctx, op.group), op.seq, f"{op.op} {op.src}->{op.dst}",
                              True, "in flight", 0) for op in extra)
        out.append(replace(trace, p2p=trace.p2p + tuple(extra), open_ops=opened + trace.open_ops))
    return out


def _desc(trace: RankTrace, ctx: RankContext | None, group: str) -> str:
    for config in (trace.pg_config, ctx.pg_config if ctx is not None else {}):
        row = config.get(group) if isinstance(config, Mapping) else None
        if row:
            return str(row[0])
    return ""
