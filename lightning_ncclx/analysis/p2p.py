"""Point-to-point: a send or recv still in flight whose peer has no matching op in flight.

Completed send/recv pairs are never findings (torchfrtrace 2.13 and 2.15 crash on a recv written
``recv 0->1``; 2.13 also on any ``nccl2:`` entry: see docs/bench-analyzer.md). Peers in the
profiling name (``send 0->1``, ``recv 1<-0``, ``recv 0->1``) are group ranks.
"""

from __future__ import annotations

from typing import Mapping

from lightning_ncclx.analysis.model import CulpritState, Finding, GroupRef, RankTrace, Verdict


def p2p_findings(by_lib: Mapping[str, Mapping[int, RankTrace]], groups: Mapping[tuple[str, str], GroupRef],
                 states: Mapping[int, CulpritState]) -> list[Finding]:
    out = []
    for lib, traces in by_lib.items():
        for rank, trace in sorted(traces.items()):
            for op in trace.p2p:
                if op.done or op.src < 0 or op.dst < 0:
                    continue
                group = groups.get((lib, op.group)) or _guess_group(lib, op.group, traces)
                members = group.ranks
                if max(op.src, op.dst) >= len(members):
                    continue
                peer = members[op.dst] if op.op == "send" else members[op.src]
                if peer == rank or peer not in traces:
                    continue
                want = "recv" if op.op == "send" else "send"
                if any(p.group == op.group and p.op == want and not p.done and (p.src, p.dst) == (op.src, op.dst)
                       for p in traces[peer].p2p):
                    continue
                msg = (f"not_entered: rank {peer} has no {want} in flight matching rank {rank}'s "
                       f"{op.op} {op.src}->{op.dst} (p2p seq {op.seq}) in group {group.name} ({group.desc}, {lib})")
                out.append(Finding(Verdict.NOT_ENTERED, (peer,), group, op.seq, op.op, None, {peer: None}, (rank,),
                                   (states[peer],) if peer in states else (), msg, "medium"))
    return out


def _guess_group(lib: str, name: str, traces: Mapping[int, RankTrace]) -> GroupRef:
    ranks = tuple(sorted(r for r, t in traces.items() if any(p.group == name for p in t.p2p)))
    return GroupRef(name, "", ranks, lib, membership_known=False)
