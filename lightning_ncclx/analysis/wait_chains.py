"""Chains of waits through sends and recvs: the culprit is the rank at their root, and the ranks
blocked on it wait on it.

A rank blocked in an op waits on the ranks that have not posted what it needs: a recv on its
sender, a send on its receiver, a collective on the ranks that never entered it (a ``not_entered``
or ``dump_missing`` finding's waiting ranks wait on its culprits). Followed from the head finding's
culprits, the waits end at ranks that wait on nobody (outside every collective, gone, without a
dump) or in a cycle. In a cycle through a recv, the root is the rank a recv waits on: it moved past,
sent elsewhere instead of, or never reached the send its peer waits for. In a cycle of sends and
collectives without a recv, the roots are the ranks whose send nobody receives. Chains without a
send or recv (a cycle of collectives is :mod:`cycles`' to root) are left as they are.

Example: a pipeline 0 -> 1 -> 2 where rank 1 skips a send and goes on to the step's all_reduce.
Rank 2 waits in its recv from rank 1; ranks 0 and 1 wait in the all_reduce for rank 2. The
all_reduce's finding names rank 2, but rank 2 waits on rank 1: rank 1 is the culprit, ranks 2 and
0 wait on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from lightning_ncclx.analysis.model import CulpritState, Finding, Verdict, Wait
from lightning_ncclx.analysis.wording import group_label, ranks_text

MAX_WAITS = 32
"""Waiting ranks a finding lists in ``waits`` (nearest the root first)."""
COLLECTIVE = "collective"
_EDGE_FINDINGS = (Verdict.NOT_ENTERED, Verdict.DUMP_MISSING)


def p2p_key(f: Finding) -> tuple:
    """What identifies a finding of :func:`p2p.p2p_findings` once later steps rewrote its text."""
    return (f.group.lib, f.group.name, f.seq, f.op, f.ranks, f.waiting_ranks)


def with_wait_chains(findings: Sequence[Finding], p2p_keys: Iterable[tuple],
                     states: Mapping[int, CulpritState]) -> list[Finding]:
    """``findings`` (likely root cause first), the head replaced by the finding that names the
    root of its chain of waits, with ``waits`` listing the ranks blocked on it; findings that name
    a waiting rank follow, each with a ``consequence:`` evidence line. Unchanged where no chain
    runs through a blocked send or recv."""
    keys = set(p2p_keys)
    if not findings or not keys:
        return list(findings)
    graph = _WaitGraph(findings, keys)
    head = findings[0]
    if head.kind not in _EDGE_FINDINGS or not head.ranks:
        return list(findings)
    start = set(head.ranks)
    while True:  # a waiter blocked in a collective waits on every rank absent from it: their roots too
        roots, through_p2p = graph.roots_of(tuple(sorted(start)))
        if roots is None:
            return list(findings)
        waits, back_p2p = graph.waiting_on(roots)
        more = graph.waited_on(roots | {w.rank for w in waits}) | start
        if more == start:
            break
        start = more
    if not (through_p2p or back_p2p):
        return list(findings)
    root_finding = head if set(head.ranks) == roots else graph.naming(roots)
    new_head = _rerooted(root_finding, roots, waits + graph.among(roots), states,
                         graph.kind[id(root_finding)] != COLLECTIVE)
    waiting = {w.rank for w in waits}
    rest, consequences = [], []
    for f in findings:
        if f is root_finding:
            continue
        blamed = [r for r in f.ranks if r in waiting]
        if f.kind not in _EDGE_FINDINGS or not blamed:
            rest.append(f)
            continue
        consequences.append(_consequence(f, blamed, roots, waits))
    return [new_head, *rest, *consequences]


class _WaitGraph:
    """Who waits on whom, from the findings: each waiting rank of an edge finding waits on its
    culprits (kept per finding, never expanded to rank pairs: 16,384 waiting ranks on 16,384
    missing ones would be 2**28 pairs)."""

    def __init__(self, findings: Sequence[Finding], p2p_keys: set[tuple]) -> None:
        self.findings = [f for f in findings if f.kind in _EDGE_FINDINGS and f.ranks]
        self.kind = {id(f): (f.op if p2p_key(f) in p2p_keys else COLLECTIVE) for f in self.findings}
        self.out: dict[int, list[Finding]] = {}
        self.into: dict[int, list[Finding]] = {}
        for f in self.findings:
            for w in f.waiting_ranks:
                self.out.setdefault(w, []).append(f)
            for c in f.ranks:
                self.into.setdefault(c, []).append(f)

    def roots_of(self, start: tuple[int, ...]) -> tuple[set[int] | None, bool]:
        """The roots the waits from ``start`` lead to (None where one leads into a cycle of
        collectives alone), and whether a send or recv was on the way."""
        sccs = self._sccs(start)
        comp = {r: i for i, scc in enumerate(sccs) for r in scc}
        roots: list[set[int] | None] = []
        through_p2p = False
        for i, scc in enumerate(sccs):  # successors first (Tarjan's order)
            after: set[int] = set()
            unknown = False
            for r in scc:
                for f in self.out.get(r, ()):
                    through_p2p = through_p2p or self.kind[id(f)] != COLLECTIVE
                    for t in f.ranks:
                        j = comp[t]
                        if j != i:
                            if roots[j] is None:
                                unknown = True
                            else:
                                after |= roots[j]
            if unknown:
                roots.append(None)
            elif after:
                roots.append(after)
            else:
                roots.append(self._cycle_roots(scc))
        found: set[int] = set()
        for r in start:
            mine = roots[comp[r]]
            if mine is None:
                return None, through_p2p
            found |= mine
        return found, through_p2p

    def _cycle_roots(self, scc: list[int]) -> set[int] | None:
        """The roots of a set of ranks that wait on each other and on nobody else."""
        if len(scc) == 1 and not self.out.get(scc[0]):
            return {scc[0]}  # waits on nobody
        members = set(scc)
        recv_targets: set[int] = set()
        in_recv: set[int] = set()
        send_sources: set[int] = set()
        for r in scc:
            for f in self.out.get(r, ()):
                kind = self.kind[id(f)]
                inside = [t for t in f.ranks if t in members]
                if kind == "recv":
                    recv_targets.update(inside)
                    in_recv.add(r)
                elif kind == "send" and inside:
                    send_sources.add(r)
        # A pipeline's stages each wait in a recv on the one before: the root is the rank a recv
        # waits on that is not itself waiting in a recv (it moved on past its send).
        return (recv_targets - in_recv) or recv_targets or send_sources or None

    def _sccs(self, start: tuple[int, ...]) -> list[list[int]]:
        """Tarjan's strongly connected components of the ranks reachable from ``start``, each
        after every component it reaches (iterative: a chain may be long)."""
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        on_stack: set[int] = set()
        stack: list[int] = []
        out: list[list[int]] = []
        for s in start:
            if s in index:
                continue
            work = [(s, self._targets(s))]
            index[s] = low[s] = len(index)
            stack.append(s)
            on_stack.add(s)
            while work:
                node, targets = work[-1]
                advanced = False
                for t in targets:
                    if t not in index:
                        index[t] = low[t] = len(index)
                        stack.append(t)
                        on_stack.add(t)
                        work.append((t, self._targets(t)))
                        advanced = True
                        break
                    if t in on_stack:
                        low[node] = min(low[node], index[t])
                if advanced:
                    continue
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        r = stack.pop()
                        on_stack.discard(r)
                        scc.append(r)
                        if r == node:
                            break
                    out.append(scc)
        return out

    def _targets(self, rank: int):
        return (t for f in self.out.get(rank, ()) for t in f.ranks)

    def waiting_on(self, roots: set[int]) -> tuple[list[Wait], bool]:
        """The ranks blocked on ``roots``, directly or through each other, nearest first (at most
        :data:`MAX_WAITS`), and whether a send or recv is among their waits."""
        seen = set(roots)
        frontier = sorted(roots)
        found: list[tuple[int, Finding, str]] = []
        through_p2p = False
        used: set[int] = set()
        while frontier:
            following: list[int] = []
            for target in frontier:
                for f in sorted(self.into.get(target, ()), key=lambda f: self.kind[id(f)] == COLLECTIVE):
                    if id(f) in used:
                        continue
                    used.add(id(f))
                    kind = self.kind[id(f)]
                    through_p2p = through_p2p or kind != COLLECTIVE
                    for w in f.waiting_ranks:
                        if w in seen:
                            continue
                        seen.add(w)
                        following.append(w)
                        if len(found) < MAX_WAITS:
                            found.append((w, f, kind))
            frontier = following
        return [Wait(w, _what(f, kind), tuple(r for r in f.ranks if r in seen)) for w, f, kind in found], through_p2p

    def waited_on(self, chain: set[int]) -> set[int]:
        """The culprits of every finding that ranks of ``chain`` wait in and that names one of them."""
        out: set[int] = set()
        for f in self.findings:
            if not chain.isdisjoint(f.ranks) and not chain.isdisjoint(f.waiting_ranks):
                out.update(f.ranks)
        return out

    def naming(self, roots: set[int]) -> Finding:
        """The finding that best names ``roots``: one whose culprits are all roots, a recv's
        first (a rank waits for their send), then a send's, then a collective's."""
        order = {"recv": 0, "send": 1, COLLECTIVE: 2}
        candidates = [f for f in self.findings if set(f.ranks) <= roots]
        if not candidates:
            candidates = sorted(self.findings, key=lambda f: -len(set(f.ranks) & roots))[:1]
        return min(candidates, key=lambda f: (set(f.ranks) != roots, not roots.isdisjoint(f.waiting_ranks),
                                              order[self.kind[id(f)]]))

    def among(self, roots: set[int]) -> list[Wait]:
        """The waits of roots on each other (a cycle: several roots, none of which can move first)."""
        out = []
        for r in sorted(roots):
            for f in self.out.get(r, ()):
                on = tuple(t for t in f.ranks if t in roots)
                if on:
                    out.append(Wait(r, _what(f, self.kind[id(f)]), on))
                    break
        return out[:MAX_WAITS]


def _what(f: Finding, kind: str) -> str:
    if kind == COLLECTIVE:
        return f"{f.op} (seq {f.seq}) of {group_label(f.group)}"
    peer = ranks_text(f.ranks)
    return f"{f.op} {'from' if kind == 'recv' else 'to'} rank {peer} (p2p {f.seq}) of {group_label(f.group)}"


def _rerooted(f: Finding, roots: set[int], waits: list[Wait], states: Mapping[int, CulpritState],
              is_p2p: bool) -> Finding:
    ranks = tuple(sorted(roots))
    message = f.message
    waiting = tuple(sorted({w.rank for w in waits} - roots))
    if waiting:
        message = (f"{message}; rank(s) {ranks_text(waiting)} wait on rank(s) {ranks_text(ranks)}, directly or "
                   "through each other (waits)")
    # the cycle's sentence reads a send or recv as a collective the culprit skipped; waits say it right
    evidence = tuple(e for e in f.evidence if not (is_p2p and e.startswith("deadlock across groups")))
    f = replace(f, message=message, evidence=evidence, waits=tuple(waits),
                waiting_ranks=tuple(r for r in f.waiting_ranks if r not in roots))
    if ranks == f.ranks:
        return f
    culprit_states = tuple(states[r] for r in ranks[:1000] if r in states)
    observed = {r: f.observed.get(r) for r in ranks[:1000]}
    return replace(f, ranks=ranks, observed=observed, culprit_states=culprit_states)


def _consequence(f: Finding, blamed: list[int], roots: set[int], waits: list[Wait]) -> Finding:
    how = {w.rank: w for w in waits}
    lines = tuple(f"consequence: rank {r} waits in {how[r].op} on rank(s) {ranks_text(how[r].on)}; the root of "
                  f"its wait is rank(s) {ranks_text(tuple(sorted(roots)))}" for r in blamed[:8] if r in how)
    only_waiters = not set(f.ranks) & roots
    kept = tuple(e for e in f.evidence if not (only_waiters and e.startswith("deadlock across groups")))
    return replace(f, evidence=lines + kept)
