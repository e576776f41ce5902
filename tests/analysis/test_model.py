"""model: the logic the frozen types carry: GroupTrack's sequence bounds, signature decoding and
call-site tail padding, OpenOp.describe, sig_dict, the JSON forms (to_dict) and Summary.headline."""

from __future__ import annotations

import json
from array import array

import pytest

from lightning_ncclx.analysis.columns import sig_id
from lightning_ncclx.analysis.model import (SCHEMA, CulpritState, Finding, GroupRef, GroupTrack, OpenOp, Straggler,
                                            Summary, Verdict, sig_dict)

AR4 = ("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))
BC8 = ("broadcast", ((2, 4),), ("Half",), ((2, 4),), ("Half",))


def _track(seqs: list[int], sigs: list[tuple], tail: tuple = ()) -> GroupTrack:
    table = {sig_id(s): s for s in sigs}
    return GroupTrack("nccl", "0", "default_pg", array("q", seqs), array("q", [sig_id(s) for s in sigs]), table,
                      bytes([1] * len(seqs)), array("q", [10 * s for s in seqs]), tail)


def test_an_empty_track_reads_sequence_zero_at_both_ends():
    t = _track([], [])
    assert (t.oldest_seq, t.newest_seq) == (0, 0)
    assert t.sigs == () and t.callsites == ()


def test_sequence_bounds_and_decoded_signatures():
    t = _track([5, 6, 9], [AR4, BC8, AR4])
    assert (t.oldest_seq, t.newest_seq) == (5, 9)
    assert t.sig(1) == BC8 and t.sig(-1) == AR4
    assert t.sigs == (AR4, BC8, AR4)


def test_callsites_are_none_before_the_kept_tail():
    t = _track([1, 2, 3, 4, 5], [AR4] * 5, tail=("a.py:1 in f", "a.py:2 in g"))
    assert t.callsites == (None, None, None, "a.py:1 in f", "a.py:2 in g")
    assert [t.callsite(i) for i in range(5)] == [None, None, None, "a.py:1 in f", "a.py:2 in g"]


@pytest.mark.parametrize("tail_len", [0, 2, 5])
def test_callsites_between_equals_slicing_the_whole_column(tail_len):
    tail = tuple(f"t.py:{i} in f" for i in range(tail_len))
    t = _track([1, 2, 3, 4, 5], [AR4] * 5, tail=tail)
    for a in range(6):
        for b in range(a, 8):  # b past the end, as a slice allows
            assert t.callsites_between(a, b) == t.callsites[a:b], (a, b)


def test_open_op_describe_says_p2p_or_seq():
    coll = OpenOp("nccl", "0", "default_pg", 21, "all_reduce", False, "started", 5)
    p2p = OpenOp("nccl", "3", "pp", 2, "send", True, "scheduled", 5)
    assert coll.describe() == "all_reduce (seq 21) in group 0 (default_pg)"
    assert p2p.describe() == "send (p2p 2) in group 3 (pp)"


def test_sig_dict_turns_nested_tuples_into_lists():
    assert sig_dict(None) is None
    assert sig_dict(BC8) == {"op": "broadcast", "input_sizes": [[2, 4]], "input_dtypes": ["Half"],
                             "output_sizes": [[2, 4]], "output_dtypes": ["Half"]}
    assert sig_dict(("x", (3, (1, 2)), (), (), ()))["input_sizes"] == [3, [1, 2]]


def test_verdict_prints_and_serializes_as_its_value():
    assert str(Verdict.SIZE_MISMATCH) == "size_mismatch"
    assert json.dumps({"v": Verdict.NOT_ENTERED}) == '{"v": "not_entered"}'


GROUP = GroupRef("1", "tp", (0, 1, 2), "nccl")


def _finding(message: str = "m", expected=AR4) -> Finding:
    state = CulpritState(2, "in_collective", "in x", "train.py:3 in step", ("nccl", "0"))
    return Finding(Verdict.SIZE_MISMATCH, (2,), GROUP, 7, "all_reduce", expected, {2: BC8, 0: None}, (0, 1),
                   (state,), message)


def test_finding_to_dict_takes_sizes_from_the_expected_signature_and_sorts_observed():
    d = _finding().to_dict()
    assert d["kind"] == "size_mismatch" and d["ranks"] == [2] and d["seq"] == 7
    assert d["sizes"] == [[4]] and d["dtypes"] == ["Float"]
    assert list(d["observed"]) == ["0", "2"] and d["observed"]["0"] is None
    assert d["observed"]["2"]["op"] == "broadcast"
    assert d["culprit_states"] == [{"rank": 2, "state": "in_collective", "detail": "in x",
                                    "location": "train.py:3 in step", "in_group": "0"}]
    assert d["group"] == {"name": "1", "desc": "tp", "ranks": [0, 1, 2], "backend": "nccl", "membership_known": True}
    assert d["confidence"] == "high" and d["evidence"] == []
    json.dumps(d)  # the documented JSON form must be serializable as is


def test_finding_without_expected_signature_has_no_sizes():
    d = _finding(expected=None).to_dict()
    assert d["expected"] is None and d["sizes"] is None and d["dtypes"] is None


def test_culprit_state_outside_any_group_has_no_in_group():
    assert CulpritState(4, "no_dump", "none").to_dict()["in_group"] is None


def test_straggler_to_dict_rounds_to_three_places():
    s = Straggler("nccl", "0", "default_pg", 3, 1.23456, 9.87654, 0.333333, 40)
    assert s.to_dict() == {"backend": "nccl", "group": "0", "desc": "default_pg", "rank": 3, "median_late_ms": 1.235,
                           "p95_late_ms": 9.877, "last_fraction": 0.333, "samples": 40}


def _summary(findings=(), notes=()) -> Summary:
    return Summary("dumps", Verdict.NO_HANG, (), None, None, None, (), tuple(findings), tuple(notes), (), (0, 1),
                   (), {1: "h1", 0: "h0"}, {}, (), (), {"world_size": 2})


def test_headline_is_the_first_finding_then_the_first_note_then_no_hang():
    assert _summary().headline == "no hang: all ranks agree"
    assert _summary(notes=("note a", "note b")).headline == "note a"
    assert _summary([_finding("first"), _finding("second")], ("note a",)).headline == "first"


def test_summary_to_dict_without_classification_and_with_sorted_hosts():
    d = _summary(notes=("n",)).to_dict()
    assert d["schema"] == SCHEMA and d["verdict"] == "no_hang" and d["headline"] == "n"
    assert d["hang_kind"] is None and d["advice"] == [] and d["restart_advice"] is None
    assert d["host_ranks"] == {"h0": [0], "h1": [1]}
    assert d["process_group"] is None and d["findings"] == []
    json.dumps(d)
