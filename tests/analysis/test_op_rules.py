"""op_rules: each collective's own size rule on one signature (all_reduce keeps sizes and dtypes,
all_gather multiplies by the group size, reduce_scatter divides; coalesced entry by entry; rules
needing the group size skipped when membership is unknown), and ``rule_finding``: the first
breaking collective in the window every rank holds, its culprits, waiting ranks and confidence."""

from __future__ import annotations

import pytest
from synth import collectives, dump, entry

from lightning_ncclx.analysis.model import CulpritState, GroupRef, Verdict
from lightning_ncclx.analysis.op_rules import rule_broken, rule_finding
from lightning_ncclx.analysis.parse import build_trace


def _sig(op: str, ins: tuple, outs: tuple, in_dt: tuple = ("Float",), out_dt: tuple = ("Float",)) -> tuple:
    return (op, ins, in_dt, outs, out_dt)


@pytest.mark.parametrize("sig, size", [
    (_sig("all_reduce", ((4,),), ((4,),)), 3),
    (_sig("allreduce_coalesced", ((4,), (2, 2)), ((4,), (2, 2)), ("Float",) * 2, ("Float",) * 2), 3),
    (_sig("all_gather_into_tensor", ((4,),), ((12,),)), 3),
    (_sig("all_gather_into_tensor", ((2, 2),), ((3, 4),)), 3),  # element counts, whatever the shape
    (_sig("allgather", ((4,),), ((4,), (4,), (4,)), ("Float",), ("Float",) * 3), 3),  # one tensor per rank
    (_sig("_reduce_scatter_base", ((12,),), ((4,),)), 3),
    (_sig("reduce_scatter", (4, 4, 4), (4,)), 3),  # bare int sizes, a list of inputs
    (_sig("all_gather", ((4,), (2,)), ((12,), (6,)), ("Float",) * 2, ("Float",) * 2), 3),  # coalesced
    (_sig("broadcast", ((4,),), ((9,),)), 3),  # no rule for broadcast
    (_sig("all_reduce", (), ((9,),)), 3),  # inputs not recorded: nothing to check
    (_sig("all_gather", ((4,),), ((8,),)), None),  # membership unknown: size rules skipped
    (_sig("all_gather", ((4,),), ((8,),)), 0),
    (_sig("all_gather", (((1,),),), ((8,),)), 3),  # a shape that is not ints: not judged
])
def test_signatures_keeping_their_rule(sig, size):
    assert rule_broken(sig, size) is None


@pytest.mark.parametrize("sig, size, rule", [
    (_sig("all_reduce", ((4,),), ((2,),)), None, "all_reduce output sizes must equal its input sizes"),
    (_sig("allreduce", ((4,),), ((4,),), ("Float",), ("Half",)), None,
     "all_reduce output dtypes must equal its input dtypes"),
    (_sig("_all_gather_base", ((2, 3),), ((12,),)), 3,
     "all_gather output element count must be input count x group size (6 x 3 = 18, not 12)"),
    (_sig("all_gather", ((4,),), ((4,), (4,)), ("Float",), ("Float",) * 2), 3,
     "all_gather output list must hold one tensor per rank (3), not 2"),
    (_sig("all_gather_into_tensor_coalesced", ((4,), (2,)), ((12,), (5,)), ("Float",) * 2, ("Float",) * 2), 3,
     "all_gather output element count must be input count x group size (3)"),
    (_sig("reduce_scatter_tensor", ((10,),), ((4,),)), 3,
     "reduce_scatter input element count must be output count x group size (4 x 3 = 12, not 10)"),
    (_sig("reduce_scatter", ((4,), (4,)), ((4,),)), 3,
     "reduce_scatter input list must hold one tensor per rank (3), not 2"),
])
def test_signatures_breaking_their_rule_say_which(sig, size, rule):
    assert rule_broken(sig, size) == rule


WORLD3 = {"0": ("default_pg", [0, 1, 2])}
GROUP3 = GroupRef("0", "default_pg", (0, 1, 2), "nccl")


def _gather(record: int, seq: int, out: int, state: str = "completed") -> dict:
    e = entry(record, seq, "_all_gather_base", state=state)
    e["output_sizes"] = [[out]]
    return e


def _tracks(per_rank: dict[int, list]) -> dict:
    return {r: build_trace(dump(es, WORLD3), r, f"rank_{r}.pkl").groups["0"] for r, es in per_rank.items()}


def test_a_healthy_group_has_no_rule_finding():
    tracks = _tracks({r: collectives(3) + [_gather(3, 4, 12)] for r in range(3)})
    assert rule_finding(GROUP3, tracks, {}) is None


def test_a_rule_broken_by_some_ranks_names_them_and_waits_with_the_others():
    state = CulpritState(2, "in_collective", "in x", None, ("nccl", "0"))
    tracks = _tracks({r: collectives(3) + [_gather(3, 4, 8 if r == 2 else 12, "scheduled")] for r in range(3)})
    f = rule_finding(GROUP3, tracks, {2: state, 0: CulpritState(0, "in_collective", "in x")})
    assert (f.kind, f.ranks, f.waiting_ranks, f.seq, f.op, f.confidence) == (
        Verdict.SIZE_MISMATCH, (2,), (0, 1), 4, "_all_gather_base", "high")
    assert f.culprit_states == (state,) and f.expected is None
    assert f.observed == {2: ("_all_gather_base", ((4,),), ("Float",), ((8,),), ("Float",))}
    assert f.message == ("size_mismatch: _all_gather_base at seq 4 of group 0 (default_pg, nccl) breaks its rule: "
                         "all_gather output element count must be input count x group size (4 x 3 = 12, not 8) "
                         "(rank(s) 2 recorded _all_gather_base[4->8]/Float)")


def test_a_rule_broken_on_every_rank_has_medium_confidence():
    tracks = _tracks({r: collectives(3) + [_gather(3, 4, 8)] for r in range(3)})
    f = rule_finding(GROUP3, tracks, {})
    assert f.ranks == (0, 1, 2) and f.waiting_ranks == () and f.confidence == "medium"


def test_the_earliest_breaking_collective_is_the_one_reported():
    es = collectives(2) + [_gather(2, 3, 8), _gather(3, 4, 6)]
    tracks = _tracks({0: es, 1: es})
    assert rule_finding(GROUP3, tracks, {}).seq == 3


def test_only_the_window_every_rank_still_holds_is_searched():
    old = [_gather(0, 1, 8)] + collectives(4, start=2)  # seq 1 broke the rule, but only rank 0 still holds it
    tracks = _tracks({0: old, 1: collectives(4, start=2)})
    assert rule_finding(GROUP3, tracks, {}) is None


def test_unknown_membership_checks_only_the_rules_that_need_no_group_size():
    gather = _tracks({0: collectives(2) + [_gather(2, 3, 8)]})
    unknown = GroupRef("0", "default_pg", (0,), "nccl", membership_known=False)
    assert rule_finding(unknown, gather, {}) is None
    bad_reduce = entry(2, 3)
    bad_reduce["output_dtypes"] = ["Half"]
    f = rule_finding(unknown, _tracks({0: collectives(2) + [bad_reduce]}), {})
    assert f.seq == 3 and "all_reduce output dtypes must equal its input dtypes" in f.message
