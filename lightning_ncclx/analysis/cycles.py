"""Two groups waiting on each other: name the cycle, and root it by program order (never by the
size of either group's majority)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Mapping

from lightning_ncclx.analysis.model import Finding, RankTrace, Verdict
from lightning_ncclx.analysis.order import departs_from_own_order, program
from lightning_ncclx.analysis.wording import ranks_text as _ranks


def with_order_deadlocks(findings: list[Finding], by_lib: Mapping[str, Mapping[int, RankTrace]]
                          ) -> tuple[list[Finding], frozenset]:
    """Add evidence where two groups wait on each other: the culprits of one group's finding
    are inside another group's collective, whose own culprits are waiting in the first. Each
    side alone reads "not entered"; together they are a call-order deadlock. Which side is the
    root cause is decided by program order (:mod:`order`), never by the size of either group's
    majority: returns the findings and the (backend, group, seq) keys of the roots."""
    not_entered = {(f.group.lib, f.group.name): f for f in findings if f.kind is Verdict.NOT_ENTERED}
    out = []
    roots: set[tuple[str, str, int]] = set()
    for f in findings:
        own = (f.group.lib, f.group.name)
        for c in f.culprit_states:
            other = not_entered.get(c.group) if c.state == "in_collective" and c.group != own else None
            if other is None or not set(other.ranks) & set(f.waiting_ranks):
                continue
            cycle = (f"deadlock across groups: rank(s) {_ranks(f.ranks)} wait in {other.op} of group "
                     f"{other.group.name} for rank(s) {_ranks(other.ranks)}, which wait in {f.op} of group "
                     f"{f.group.name} for them: rank(s) {_ranks(f.ranks)} skipped that {f.op} or call the two "
                     "groups in a different order")
            root = _cycle_root(f, other, by_lib.get(f.group.lib, {}))
            if root is not None:
                winner, why = root
                roots.add((winner.group.lib, winner.group.name, winner.seq))
                if winner is f:
                    f = replace(f, message=f"{f.message}. {why}")
            f = replace(f, evidence=(cycle,) + f.evidence)
            break
        out.append(f)
    return out, frozenset(roots)


def _cycle_root(a: Finding, b: Finding, traces: Mapping[int, RankTrace]) -> tuple[Finding, str] | None:
    """Of two findings waiting on each other, the one whose culprits left their own call pattern
    (the others kept theirs); else the one whose culprits went elsewhere first."""
    departures = {}
    for f in (a, b):
        found = [(r, departs_from_own_order(traces[r])) for r in f.ranks if r in traces]
        departures[id(f)] = [(r, d) for r, d in found if d is not None]
    left = [f for f in (a, b) if departures[id(f)]]
    if len(left) == 1:
        root = left[0]
        other = b if root is a else a
        rank, (expected, called, _, _) = departures[id(root)][0]
        why = (f"why rank {rank}: it skipped {root.op} #{root.seq} of group {root.group.name} and went on to "
               f"{called[1]} of group {called[0]} (its earlier steps call {expected[1]} of group {expected[0]} "
               f"there), while rank(s) {_ranks(other.ranks)} kept their order; rank(s) "
               f"{_ranks(root.waiting_ranks)} wait in group {root.group.name} for it")
        return root, why
    return _by_peers_next_call(a, b, traces)


def _by_peers_next_call(a: Finding, b: Finding, traces: Mapping[int, RankTrace]) -> tuple[Finding, str] | None:
    """The ranks that belong to both groups share a role: the group most of them went to last is
    the common order; the finding whose culprits went to the other group is the root."""
    both = set(a.group.ranks) & set(b.group.ranks) & set(traces)
    went: dict[int, str] = {}
    for r in both:
        calls = program(traces[r])
        if calls:
            went[r] = calls[-1][1]
    counts = Counter(went.values()).most_common()
    if len(counts) < 2 or counts[0][1] == counts[1][1]:
        return None
    common = counts[0][0]
    for root, other in ((a, b), (b, a)):
        if root.ranks and all(went.get(r) == other.group.name for r in root.ranks) and root.group.name == common:
            peers = tuple(sorted(r for r, g in went.items() if g == common))
            return root, (f"why rank(s) {_ranks(root.ranks)}: they went to {other.op} of group {other.group.name} "
                          f"where rank(s) {_ranks(peers)}, members of both groups, went on to {root.op} "
                          f"#{root.seq} of group {root.group.name}; rank(s) {_ranks(root.waiting_ranks)} wait there "
                          "for them")
    return None
