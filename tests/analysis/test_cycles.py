"""cycles: two not_entered findings whose culprits wait in each other's group are one cross-group
deadlock. Evidence names the cycle on both; the root is the side whose culprits left their own
call order, else the side whose culprits went to the group most shared members left last; no
root (and no message change) when neither tells."""

from __future__ import annotations

from dataclasses import replace

from synth import T0, dump, entry

from lightning_ncclx.analysis.cycles import with_order_deadlocks
from lightning_ncclx.analysis.model import CulpritState, Finding, GroupRef, Verdict
from lightning_ncclx.analysis.parse import build_trace

WORLD = GroupRef("0", "default_pg", (0, 1, 2, 3), "nccl")


def _not_entered(group: GroupRef, ranks: tuple, waiting: tuple, culprits_in: str | None, seq: int = 5,
                 message: str = "m") -> Finding:
    states = tuple(CulpritState(r, "in_collective", "in x", None, ("nccl", culprits_in)) if culprits_in
                   else CulpritState(r, "outside_collective", "out") for r in ranks)
    return Finding(Verdict.NOT_ENTERED, ranks, group, seq, "all_reduce", None, {r: None for r in ranks}, waiting,
                   states, message)


def _traces(calls: dict[int, list[tuple[str, int]]], groups: dict) -> dict:
    """rank -> trace from its calls in order: (group name, seq); the last one is still in flight."""
    out = {}
    for rank, seq_calls in calls.items():
        es = [entry(i, seq, pg=(g, groups[g][0]), t_ns=T0 + 1000 * i,
                    state="scheduled" if i == len(seq_calls) - 1 else "completed")
              for i, (g, seq) in enumerate(seq_calls)]
        out[rank] = build_trace(dump(es, groups), rank, f"rank_{rank}.pkl")
    return {"nccl": out}


# World {0,1,2,3} and pair {2,3}: every step calls the pair's all_reduce, then the world's. At step
# 5 rank 3 skips the pair's and goes on to the world's: it waits there for rank 2, which waits in
# the pair's for rank 3.
PAIR = GroupRef("1", "pair23", (2, 3), "nccl")
PAIR_GROUPS = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("pair23", [2, 3])}


def _pair_traces() -> dict:
    calls = {}
    for rank in range(4):
        steps = []
        for step in range(1, 6):
            if rank in (2, 3) and not (rank == 3 and step == 5):
                steps.append(("1", step))
            if not (rank == 2 and step == 5):
                steps.append(("0", step))
        calls[rank] = steps
    return _traces(calls, PAIR_GROUPS)


def test_findings_without_a_cycle_are_returned_unchanged_with_no_roots():
    a = _not_entered(WORLD, (1,), (0, 2, 3), None)
    b = _not_entered(PAIR, (2,), (3,), "0")  # rank 2 is in group 0, but group 0's culprit (1) does not wait on it
    out, roots = with_order_deadlocks([a, b], {})
    assert out == [a, b] and roots == frozenset()


def test_only_not_entered_findings_are_cycle_partners():
    pair = _not_entered(PAIR, (3,), (2,), "0")
    world = replace(_not_entered(WORLD, (2,), (0, 1, 3), "1"), kind=Verdict.SIZE_MISMATCH)
    out, _ = with_order_deadlocks([pair, world], {})
    assert out[0].evidence == ()  # group 0's finding is a mismatch, not ranks waiting on each other
    assert out[1].evidence[0].startswith("deadlock across groups")  # group 1's finding still is not_entered


def test_the_cycle_comes_first_in_the_evidence():
    pair = replace(_not_entered(PAIR, (3,), (2,), "0"), evidence=("call sites differ",))
    world = _not_entered(WORLD, (2,), (0, 1, 3), "1")
    (pair_out, _), _ = with_order_deadlocks([pair, world], {})
    assert len(pair_out.evidence) == 2 and pair_out.evidence[1] == "call sites differ"
    assert pair_out.evidence[0].startswith("deadlock across groups")


def test_a_culprit_in_its_own_group_is_no_cycle():
    a = _not_entered(WORLD, (3,), (0, 1, 2), "0")
    out, roots = with_order_deadlocks([a], {})
    assert out == [a] and roots == frozenset()


def test_the_side_that_left_its_own_order_is_the_root_and_both_carry_the_cycle():
    pair = _not_entered(PAIR, (3,), (2,), "0", message="pair msg")
    world = _not_entered(WORLD, (2,), (0, 1, 3), "1", message="world msg")
    (pair_out, world_out), roots = with_order_deadlocks([pair, world], _pair_traces())
    assert roots == frozenset({("nccl", "1", 5)})
    assert pair_out.evidence == (
        "deadlock across groups: rank(s) 3 wait in all_reduce of group 0 for rank(s) 2, which wait in all_reduce "
        "of group 1 for them: rank(s) 3 skipped that all_reduce or call the two groups in a different order",)
    assert pair_out.message == (
        "pair msg. why rank 3: it skipped all_reduce #5 of group 1 and went on to all_reduce of group 0 (its "
        "earlier steps call all_reduce of group 1 there), while rank(s) 2 kept their order; rank(s) 2 wait in "
        "group 1 for it")
    assert world_out.message == "world msg"  # not the root: its message is left as it was
    assert world_out.evidence[0].startswith("deadlock across groups: rank(s) 2 wait in all_reduce of group 1 for "
                                            "rank(s) 3")


def test_the_root_does_not_depend_on_the_order_of_the_findings():
    pair = _not_entered(PAIR, (3,), (2,), "0")
    world = _not_entered(WORLD, (2,), (0, 1, 3), "1")
    _, roots = with_order_deadlocks([world, pair], _pair_traces())
    assert roots == frozenset({("nccl", "1", 5)})


# Without a period to break, the ranks in both groups decide: A = {0,1,2,3}, B = {1,2,3}. Ranks 1
# and 2 went last to B; rank 3 went to A. B is the common order: rank 3 left it.
B = GroupRef("1", "b", (1, 2, 3), "nccl")
AB_GROUPS = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("b", [1, 2, 3])}


def test_without_a_period_the_group_most_shared_members_went_to_names_the_root():
    by_lib = _traces({0: [("0", 1)], 1: [("1", 1)], 2: [("1", 1)], 3: [("0", 1)]}, AB_GROUPS)
    in_b = _not_entered(B, (3,), (1, 2), "0", seq=1, message="b msg")
    in_a = _not_entered(WORLD, (1, 2), (0, 3), "1", seq=1, message="a msg")
    (b_out, a_out), roots = with_order_deadlocks([in_b, in_a], by_lib)
    assert roots == frozenset({("nccl", "1", 1)})
    assert b_out.message == ("b msg. why rank(s) 3: they went to all_reduce of group 0 where rank(s) 1, 2, members "
                             "of both groups, went on to all_reduce #1 of group 1; rank(s) 1, 2 wait there for them")
    assert a_out.message == "a msg" and len(a_out.evidence) == 1


def test_a_tie_among_shared_members_names_no_root_but_keeps_the_cycle():
    pair_only = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("pair23", [2, 3])}
    by_lib = _traces({0: [("0", 1)], 1: [("0", 1)], 2: [("1", 1)], 3: [("0", 1)]}, pair_only)
    pair = _not_entered(PAIR, (3,), (2,), "0", seq=1, message="p")
    world = _not_entered(WORLD, (2,), (0, 1, 3), "1", seq=1, message="w")
    out, roots = with_order_deadlocks([pair, world], by_lib)
    assert roots == frozenset()
    assert [f.message for f in out] == ["p", "w"]
    assert all(f.evidence[0].startswith("deadlock across groups") for f in out)


def test_no_traces_for_the_backend_still_names_the_cycle():
    pair = _not_entered(PAIR, (3,), (2,), "0")
    world = _not_entered(WORLD, (2,), (0, 1, 3), "1")
    out, roots = with_order_deadlocks([pair, world], {})
    assert roots == frozenset() and all(len(f.evidence) == 1 for f in out)
