"""Per-rank state: in which collective each rank is, or where its code is when outside one."""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Callable, Iterator, Mapping

from lightning_ncclx.analysis.model import CulpritState, RankContext, RankRow, RankTrace, TimelineOp

TIMELINE_LENGTH = 20


def culprit_state(rank: int, by_lib: Mapping[str, Mapping[int, RankTrace]], stacks: Mapping[int, str],
                  activities: Mapping[int, str] | None = None) -> CulpritState:
    """``in_collective`` (its oldest unfinished op, located by that op's frames), else
    ``outside_collective`` (located by the main thread in ``rank_<R>.stacks.txt``), else ``no_dump``."""
    traces = [lib_traces[rank] for lib_traces in by_lib.values() if rank in lib_traces]
    if not traces:
        return CulpritState(rank, "no_dump", "no flight-recorder dump from this rank", stacks.get(rank))
    open_ops = sorted((op for t in traces for op in t.open_ops), key=lambda o: o.time_ns)
    if open_ops:
        op = open_ops[0]
        location = _first_user(op.frames) or stacks.get(rank)
        return CulpritState(rank, "in_collective", f"in {op.describe()} [{op.state or 'unfinished'}]", location,
                            (op.lib, op.group))
    where = stacks.get(rank)
    detail = "outside any collective (every recorded op finished)"
    activity = (activities or {}).get(rank)
    if activity:
        detail = f"outside any collective, {activity}"
    return CulpritState(rank, "outside_collective", detail, where)


def _first_user(frames: tuple[str, ...]) -> str | None:
    from lightning_ncclx.analysis.frames import is_library_file

    for f in frames:
        if not is_library_file(f.rsplit(":", 1)[0]):
            return f
    return frames[0] if frames else None


def timeline(rank: int, by_lib: Mapping[str, Mapping[int, RankTrace]], length: int = TIMELINE_LENGTH) -> tuple[TimelineOp, ...]:
    """The rank's newest ``length`` collectives over all its groups, oldest first (by creation
    time, then group and sequence id)."""
    ops: list[tuple] = []
    for lib_traces in by_lib.values():
        trace = lib_traces.get(rank)
        if trace is None:
            continue
        for name, tr in trace.groups.items():
            start = max(0, len(tr.seqs) - length)
            ops.extend(zip(repeat(name), tr.seqs[start:], map(_OP, map(tr.sig_table.__getitem__, tr.sig_ids[start:])),
                           map(bool, tr.done[start:]), tr.times_ns[start:]))
    ops.sort(key=_WHEN)
    return tuple(map(tuple.__new__, repeat(TimelineOp), ops[-length:]))  # rows in field order: no call per op


_OP = itemgetter(0)
_WHEN = itemgetter(4, 0, 1)  # TimelineOp's time_ns, group, seq


MAX_MISSING_ROWS = 1000
"""Rows for ranks without a dump, culprits first: a folder with 8 dumps of a 100k-rank job lists
1000 of the others (``ranks_missing`` has them all)."""
MAX_LISTED = 1000
"""Culprits whose state (and signature) a finding lists one by one; its ``ranks`` has them all."""


def listed(ranks: tuple[int, ...]) -> tuple[int, ...]:
    """The ranks of a finding that get a state of their own (a 100k-rank group that left 3 dumps
    must not build 100k of them)."""
    return ranks[:MAX_LISTED]


class RankStates(Mapping[int, CulpritState]):
    """rank -> :class:`CulpritState` for ``range(world)``, computed when first asked for (a
    100k-rank world with a few dumps must not build 100k states up front)."""

    def __init__(self, world: int, compute: Callable[[int], CulpritState]) -> None:
        self._world, self._compute, self._cache = world, compute, {}

    def __getitem__(self, rank: int) -> CulpritState:
        if not isinstance(rank, int) or not 0 <= rank < self._world:
            raise KeyError(rank)
        if rank not in self._cache:
            self._cache[rank] = self._compute(rank)
        return self._cache[rank]

    def __setitem__(self, rank: int, state: CulpritState) -> None:
        self._cache[rank] = state

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._world))

    def __len__(self) -> int:
        return self._world


def rank_rows(seen: tuple[int, ...], missing: tuple[int, ...], by_lib: Mapping[str, Mapping[int, RankTrace]],
              states: Mapping[int, CulpritState], contexts: Mapping[int, RankContext],
              keep: tuple[int, ...] = ()) -> tuple[RankRow, ...]:
    """One row per dumped rank, per rank in ``keep`` (culprits, up to :data:`MAX_LISTED` of them
    without a dump), and per missing rank up to :data:`MAX_MISSING_ROWS`."""
    absent = set(missing)
    culprits = sorted({r for r in keep if r in absent})[:MAX_LISTED]
    others = sorted(missing)[:MAX_MISSING_ROWS]
    rows = []
    for r in sorted(set(seen) | set(culprits) | set(others)):
        st = states.get(r) or culprit_state(r, by_lib, {})
        ctx = contexts.get(r)
        rows.append(RankRow(r, ctx.host if ctx else None, st.state, st.detail, st.location, timeline(r, by_lib)))
    return tuple(rows)
