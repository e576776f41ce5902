"""ranks: each rank's state (in a collective, located by its frames; outside any, located by its
stacks file and activity; no dump), its timeline, the lazy RankStates mapping, and which ranks get
a row of the per-rank table."""

from __future__ import annotations

import pytest
from synth import T0, collectives, dump, entry

from lightning_ncclx.analysis.model import CulpritState, RankContext, TimelineOp
from lightning_ncclx.analysis.parse import build_trace
from lightning_ncclx.analysis.ranks import MAX_MISSING_ROWS, RankStates, culprit_state, rank_rows, timeline

WORLD = {"0": ("default_pg", [0, 1, 2]), "5": ("tp", [0, 1])}
TORCH = {"name": "all_reduce", "filename": "/usr/lib/python3.11/site-packages/torch/distributed/c10d.py", "line": 1}
USER = {"name": "step", "filename": "train.py", "line": 42}


def _trace(rank: int, entries: list):
    return build_trace(dump(entries, WORLD), rank, f"rank_{rank}.pkl")


def test_a_rank_without_a_dump_is_no_dump_located_by_its_stacks():
    st = culprit_state(4, {"nccl": {0: _trace(0, collectives(2))}}, {4: "train.py:9 in load"})
    assert (st.rank, st.state, st.location, st.group) == (4, "no_dump", "train.py:9 in load", None)
    assert st.detail == "no flight-recorder dump from this rank"


def test_a_rank_in_a_collective_is_located_by_its_first_user_frame():
    es = collectives(3, last_state="started", frames=[TORCH, USER])
    st = culprit_state(0, {"nccl": {0: _trace(0, es)}}, {0: "elsewhere.py:1 in x"})
    assert st.state == "in_collective" and st.group == ("nccl", "0")
    assert st.detail == "in all_reduce (seq 3) in group 0 (default_pg) [started]"
    assert st.location == "train.py:42 in step"


def test_library_only_frames_fall_back_to_the_innermost_frame_and_no_frames_to_the_stacks():
    lib_only = _trace(0, collectives(2, last_state="scheduled", frames=[TORCH]))
    assert culprit_state(0, {"nccl": {0: lib_only}}, {}).location.endswith("torch/distributed/c10d.py:1 in all_reduce")
    bare = _trace(0, collectives(2, last_state="scheduled"))
    assert culprit_state(0, {"nccl": {0: bare}}, {0: "train.py:7 in f"}).location == "train.py:7 in f"


def test_the_oldest_open_op_across_backends_and_groups_is_the_one_a_rank_is_in():
    nccl = collectives(2) + [entry(2, 1, pg=("5", "tp"), state="scheduled", t_ns=T0 + 50_000)]
    gloo = [entry(0, 4, "broadcast", lib="gloo", state="scheduled", t_ns=T0 + 10_000)]
    gloo[0]["retired"] = False
    by_lib = {"nccl": {1: _trace(1, nccl)}, "gloo": {1: _trace(1, gloo)}}
    st = culprit_state(1, by_lib, {})
    assert st.group == ("gloo", "0") and st.detail == "in broadcast (seq 4) in group 0 (default_pg) [scheduled]"


def test_an_open_op_without_a_state_reads_unfinished():
    es = collectives(2, last_state="scheduled")
    es[-1]["state"] = ""
    assert culprit_state(0, {"nccl": {0: _trace(0, es)}}, {}).detail.endswith("[unfinished]")


def test_a_rank_with_every_op_finished_is_outside_with_its_activity():
    by_lib = {"nccl": {2: _trace(2, collectives(3))}}
    plain = culprit_state(2, by_lib, {2: "train.py:5 in eval"})
    assert (plain.state, plain.location) == ("outside_collective", "train.py:5 in eval")
    assert plain.detail == "outside any collective (every recorded op finished)"
    busy = culprit_state(2, by_lib, {}, {2: "waiting for the data loader: x.py:1 in get"})
    assert busy.detail == "outside any collective, waiting for the data loader: x.py:1 in get"
    assert busy.location is None


def test_timeline_is_the_newest_ops_across_groups_in_time_order():
    es = [entry(i, i + 1, t_ns=T0 + 10 * i) for i in range(5)]
    es += [entry(5, 1, "broadcast", pg=("5", "tp"), t_ns=T0 + 25, state="started")]
    ops = timeline(0, {"nccl": {0: _trace(0, es)}}, length=3)
    assert [(o.group, o.seq, o.op, o.done) for o in ops] == [
        ("5", 1, "broadcast", False), ("0", 4, "all_reduce", True), ("0", 5, "all_reduce", True)]
    assert [o.time_ns for o in ops] == [T0 + 25, T0 + 30, T0 + 40]
    assert all(type(o) is TimelineOp and type(o.done) is bool for o in ops)
    assert ops[0].to_dict() == {"group": "5", "seq": 1, "op": "broadcast", "done": False, "time_ns": T0 + 25}
    assert timeline(9, {"nccl": {0: _trace(0, es)}}) == ()


def test_rank_states_are_computed_once_on_demand_and_bounded_by_the_world():
    calls: list[int] = []

    def compute(rank: int) -> CulpritState:
        calls.append(rank)
        return CulpritState(rank, "no_dump", "d")

    states = RankStates(100_000, compute)
    assert len(states) == 100_000 and calls == []
    assert states[7].rank == 7 and states[7] is states[7] and calls == [7]
    for bad in (-1, 100_000, "3", 2.0):
        with pytest.raises(KeyError):
            states[bad]
    assert states.get(100_000) is None and 5 in states and -1 not in states
    assert calls == [7, 5]  # membership asks for the state
    states[7] = CulpritState(7, "process_gone", "gone")
    assert states[7].state == "process_gone" and calls == [7, 5]
    assert list(RankStates(3, compute)) == [0, 1, 2]


def test_rank_rows_list_dumped_ranks_culprits_and_the_first_missing_ranks():
    by_lib = {"nccl": {0: _trace(0, collectives(2))}}
    world = 2 + MAX_MISSING_ROWS + 10
    missing = tuple(range(1, world))
    states = RankStates(world, lambda r: culprit_state(r, by_lib, {}))
    contexts = {0: RankContext(0, "c", host="node-a")}
    rows = rank_rows((0,), missing, by_lib, states, contexts, keep=(world - 1,))
    listed = [row.rank for row in rows]
    assert listed == list(range(0, MAX_MISSING_ROWS + 1)) + [world - 1]
    assert (rows[0].host, rows[0].state, len(rows[0].timeline)) == ("node-a", "outside_collective", 2)
    assert rows[1].host is None and rows[1].state == "no_dump" and rows[-1].state == "no_dump"
