"""wait_chains: a rank blocked in a send or recv on the culprit is a waiter, not a culprit; the
culprit is the root of the chain of waits (gloo jobs whose in-flight sends and recvs come from
context.json, as the watchdog writes them)."""

from __future__ import annotations

from dataclasses import replace

from synth import cross_group_deadlock, p2p_folder

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.wait_chains import with_wait_chains
from lightning_ncclx.report.text import render_text


def _waits(summary) -> dict[int, tuple[tuple[int, ...], str]]:
    return {w.rank: (w.on, w.op) for w in summary.findings[0].waits}


def test_a_rank_that_skips_a_send_is_the_culprit_not_the_rank_waiting_for_it(tmp_path):
    # pipeline 0 -> 1 -> 2: rank 1 skipped its send and waits in the all_reduce with rank 0;
    # rank 2 waits in its recv from rank 1, so the all_reduce's own finding names rank 2
    s = analyze_folder(p2p_folder(tmp_path, 3, (0, 1), {2: [("recv", 1, 2)]}))
    assert s.culprit_ranks == (1,) and s.waiting_ranks == (2,) and s.op == "recv"
    assert s.classification.kind.value == "program_divergence"
    assert "misaddressed the send they wait for" in s.classification.reason
    waits = _waits(s)
    assert waits[2] == ((1,), "recv from rank 1 (p2p 20) of group 1 (pipe, gloo)")
    assert waits[0][0] == (2,) and waits[0][1].startswith("all_reduce (seq 5) of group 0")
    lower = next(f for f in s.findings if f.ranks == (2,))
    assert lower.evidence[0].startswith("consequence: rank 2 waits in recv from rank 1")


def test_a_send_to_the_wrong_peer_names_the_sender_alone(tmp_path):
    # rank 1 sends to rank 0 (in the all_reduce) instead of rank 2 (in its recv from rank 1)
    s = analyze_folder(p2p_folder(tmp_path, 3, (0,), {1: [("send", 1, 0)], 2: [("recv", 1, 2)]}))
    assert s.culprit_ranks == (1,) and s.classification.kind.value == "program_divergence"
    assert sorted(_waits(s)) == [0, 2] and _waits(s)[0][0] == (1, 2)
    blaming_0 = next(f for f in s.findings if f.ranks == (0,))
    assert blaming_0.evidence[0].startswith("consequence: rank 0 waits in all_reduce")
    assert not any(e.startswith("deadlock across groups") for e in blaming_0.evidence)


def test_in_a_long_pipeline_the_stage_that_moved_past_its_send_is_the_only_root(tmp_path):
    # 8 stages: rank 1 skipped its send and waits in the all_reduce with rank 0; ranks 2-7 each wait
    # in a recv from the stage before. Every recv target but rank 1 is itself blocked in a recv.
    recvs = {r: [("recv", r - 1, r)] for r in range(2, 8)}
    s = analyze_folder(p2p_folder(tmp_path, 8, (0, 1), recvs))
    assert s.culprit_ranks == (1,), [f.message for f in s.findings]
    assert s.classification.kind.value == "program_divergence"
    assert _waits(s)[2][0] == (1,) and _waits(s)[7][0] == (6,)


def test_a_long_chain_is_followed_to_the_rank_that_waits_on_nobody(tmp_path):
    # 0 -> 1 -> 2 -> 3: rank 1 is outside every collective; 2 waits on it, 3 on 2, 0 on all three
    s = analyze_folder(p2p_folder(tmp_path, 4, (0,), {2: [("recv", 1, 2)], 3: [("recv", 2, 3)]}))
    assert s.culprit_ranks == (1,) and s.classification.kind.value == "stuck_outside_collective"
    waits = _waits(s)
    assert waits[2][0] == (1,) and waits[3][0] == (2,) and waits[0][0] == (1, 2, 3)
    assert [w.rank for w in s.findings[0].waits] == [2, 0, 3]  # nearest the root first


def test_several_roots_are_all_named(tmp_path):
    # rank 0 waits in the all_reduce for 1, 2 and 3: rank 2 waits in a recv from 1; 1 and 3 are elsewhere
    s = analyze_folder(p2p_folder(tmp_path, 4, (0,), {2: [("recv", 1, 2)]}))
    assert s.culprit_ranks == (1, 3) and s.waiting_ranks == (2,)
    assert {w.rank for w in s.findings[0].waits} == {0, 2}


def test_ranks_that_receive_from_each_other_are_both_roots_of_the_cycle(tmp_path):
    for ops in ([("recv", 1, 0)], [("send", 0, 1)]):
        back = [(op, dst, src) for op, src, dst in ops]
        folder = tmp_path / ops[0][0]
        s = analyze_folder(p2p_folder(folder, 3, (2,), {0: ops, 1: back}))
        assert s.culprit_ranks == (0, 1) and s.waiting_ranks == (2,), [f.message for f in s.findings]
        waits = _waits(s)
        assert waits[2][0] == (0, 1) and waits[0][0] == (1,) and waits[1][0] == (0,)  # each on the other


def test_a_send_nobody_receives_names_the_sender_when_its_peer_waits_in_a_collective(tmp_path):
    s = analyze_folder(p2p_folder(tmp_path, 2, (0,), {1: [("send", 1, 0)]}))
    assert s.culprit_ranks == (1,) and s.waiting_ranks == (0,) and s.op == "all_reduce"


def test_the_text_report_lists_who_waits_on_the_culprit(tmp_path):
    text = render_text(analyze_folder(p2p_folder(tmp_path, 3, (0, 1), {2: [("recv", 1, 2)]})))
    assert "HANG: not_entered - culprit rank(s) 1\n" in text
    assert "  rank 2 waits on rank(s) 1: in recv from rank 1 (p2p 20) of group 1 (pipe, gloo)" in text


def test_the_json_form_lists_the_waits(tmp_path):
    d = analyze_folder(p2p_folder(tmp_path, 3, (0, 1), {2: [("recv", 1, 2)]})).to_dict()
    assert d["culprit_ranks"] == [1]
    assert d["findings"][0]["waits"][0] == {"rank": 2, "in": "recv from rank 1 (p2p 20) of group 1 (pipe, gloo)",
                                            "on": [1]}
    assert d["findings"][1]["waits"] == []


def test_chains_without_a_send_or_recv_are_left_alone(tmp_path):
    s = analyze_folder(cross_group_deadlock(tmp_path))
    assert all(not f.waits for f in s.findings)
    keys = {(f.group.lib, f.group.name, f.seq, f.op, f.ranks, f.waiting_ranks) for f in s.findings}
    assert with_wait_chains(s.findings, keys, {}) == list(s.findings)  # collectives alone: cycles.py decides
    assert with_wait_chains(s.findings, (), {}) == list(s.findings)


def test_a_head_naming_the_sender_and_its_waiter_is_rerooted_to_the_sender(tmp_path):
    # whichever finding sorts first: the all_reduce's ("rank(s) 1, 2 never entered") names rank 2 too
    s = analyze_folder(p2p_folder(tmp_path, 3, (0,), {1: [("send", 1, 0)], 2: [("recv", 1, 2)]}))
    collective = next(f for f in s.findings if f.op == "all_reduce")
    assert collective.ranks == (1, 2)
    p2p = [f for f in s.findings if f.op in ("send", "recv")]
    keys = [(f.group.lib, f.group.name, f.seq, f.op, f.ranks, f.waiting_ranks) for f in p2p]
    bare = [replace(f, waits=(), evidence=()) for f in (collective, *p2p)]
    head = with_wait_chains(bare, keys, {})[0]
    assert head.ranks == (1,) and head.op == "recv" and {w.rank for w in head.waits} == {0, 2}
