"""Point-to-point: a send or recv still in flight whose peer has no matching op in flight.

Completed send/recv pairs are never findings (torchfrtrace 2.13 and 2.15 crash on a recv written
``recv 0->1``; 2.13 also on any ``nccl2:`` entry: see docs/bench-analyzer.md). Peers in the
profiling name (``send 0->1``, ``recv 1<-0``, ``recv 0->1``) are group ranks.
"""

from __future__ import annotations

from typing import Mapping

from lightning_ncclx.analysis.model import CulpritState, Finding, GroupRef, P2POp, RankTrace, Verdict


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
