"""Which global ranks belong to each process group.

Order of trust: the dumps' own ``pg_config`` (the plugin's are repaired for gloo), then the plugin's
``context.json`` ``pg_config``, then inference from which ranks' dumps mention the group (gloo's
raw ``pg_config`` is a single ``""`` key and useless). The default group spans the world size.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from lightning_ncclx.analysis.model import GroupRef, RankContext, RankTrace


MAX_WORLD_SIZE = 1 << 20
"""A declared world size above this is not believed (a corrupt context, not a job)."""


def world_size(traces: tuple[RankTrace, ...], contexts: Mapping[int, RankContext]) -> int:
    sizes = [c.world_size for c in contexts.values() if c.world_size and 0 < c.world_size <= MAX_WORLD_SIZE]
    highest: dict[int, int] = {}  # by id: the loader shares one tuple per distinct membership
    for t in traces:
        for desc, ranks in t.pg_config.values():
            if desc == "default_pg" and ranks:
                top = highest.get(id(ranks))
                if top is None:
                    top = highest[id(ranks)] = max(ranks)
                if top < MAX_WORLD_SIZE:
                    sizes.append(top + 1)
    seen = [t.rank + 1 for t in traces] + [r + 1 for r in contexts]
    return max(sizes + seen + [0])


def resolve_groups(traces: tuple[RankTrace, ...], contexts: Mapping[int, RankContext]) -> dict[tuple[str, str], GroupRef]:
    """(backend, group name) -> GroupRef with the group's global ranks, for every group that
    appears in some entry (collective or point-to-point)."""
    world = world_size(traces, contexts)
    mentions: dict[tuple[str, str], set[int]] = {}
    descs: dict[tuple[str, str], str] = {}
    for t in traces:
        for name, track in t.groups.items():
            mentions.setdefault((t.lib, name), set()).add(t.rank)
            descs.setdefault((t.lib, name), track.desc)
        for name in {op.group for op in t.p2p}:  # a group used only for send/recv
            mentions.setdefault((t.lib, name), set()).add(t.rank)
            declared = t.pg_config.get(name)
            if declared is not None and declared[0]:
                descs.setdefault((t.lib, name), declared[0])
    declared = _Declared(traces, contexts)
    out: dict[tuple[str, str], GroupRef] = {}
    for (lib, name), ranks_seen in sorted(mentions.items()):
        desc = descs.get((lib, name), "")
        ranks = declared.members(lib, name)
        known = ranks is not None
        if ranks is None:
            ranks = tuple(sorted(ranks_seen))
            if desc == "default_pg" or (name == "0" and desc in ("", "undefined")):
                ranks, known = tuple(range(max(world, max(ranks_seen) + 1))), True
        out[(lib, name)] = GroupRef(name=name, desc=desc, ranks=ranks, lib=lib, membership_known=known)
    return out


class _Declared:
    """Every group's declared memberships, counted in one pass over the dumps (16,384 ranks in
    2,049 groups: one pass per group took seconds), then the contexts' as the fallback."""

    def __init__(self, traces: tuple[RankTrace, ...], contexts: Mapping[int, RankContext]) -> None:
        # counting by identity first: hashing a 16k-rank tuple is O(16k), and the loader shares
        # one tuple per distinct membership
        self._by_id: dict[tuple[str, str], Counter[int]] = {}
        self._objects: dict[int, tuple[int, ...]] = {}
        for t in traces:
            for name, (_, ranks) in t.pg_config.items():
                self._by_id.setdefault((t.lib, name), Counter())[id(ranks)] += 1
                self._objects[id(ranks)] = ranks
        self._contexts = contexts
        self._from_contexts: dict[str, Counter[tuple[int, ...]]] | None = None

    def members(self, lib: str, name: str) -> tuple[int, ...] | None:
        votes: Counter[tuple[int, ...]] = Counter()
        for key, n in self._by_id.get((lib, name), {}).items():
            votes[self._objects[key]] += n
        if not votes:
            votes = self._context_votes().get(name, Counter())
        if not votes:
            return None
        return tuple(sorted(votes.most_common(1)[0][0]))

    def _context_votes(self) -> dict[str, Counter[tuple[int, ...]]]:
        if self._from_contexts is None:
            self._from_contexts = {}
            for c in self._contexts.values():
                for name, (_, ranks) in c.pg_config.items():
                    self._from_contexts.setdefault(name, Counter())[ranks] += 1
        return self._from_contexts
