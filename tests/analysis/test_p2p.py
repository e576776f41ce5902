"""p2p: in-flight sends/recvs whose peer has no matching op in flight are not_entered on the peer
(group ranks translated to global ranks); matched in-flight pairs that disagree are one size or
dtype mismatch; finished, self-addressed, any-source, out-of-group and undumped peers are not."""

from __future__ import annotations

from synth import collectives, dump, entry

from lightning_ncclx.analysis.groups import resolve_groups
from lightning_ncclx.analysis.model import CulpritState, Verdict
from lightning_ncclx.analysis.p2p import p2p_findings
from lightning_ncclx.analysis.parse import build_trace

WORLD4 = {"0": ("default_pg", [0, 1, 2, 3]), "3": ("pp", [2, 3])}


def _p2p(name: str, state: str = "scheduled", pg: tuple = ("0", "default_pg"), **kw) -> dict:
    return entry(9, 0, name, pg=pg, p2p_seq=kw.pop("p2p_seq", 1), is_p2p=True, state=state, **kw)


def _findings(per_rank: dict[int, list], groups: dict = WORLD4, states: dict | None = None):
    traces = tuple(build_trace(dump(collectives(2) + es, groups), r, f"rank_{r}.pkl") for r, es in per_rank.items())
    by_lib = {"nccl": {t.rank: t for t in traces}}
    return p2p_findings(by_lib, resolve_groups(traces, {}), states or {})


def test_an_in_flight_recv_without_a_send_blames_the_sender():
    (f,) = _findings({0: [], 1: [_p2p("recv 1<-0", p2p_seq=3)]})
    assert (f.kind, f.ranks, f.waiting_ranks, f.op, f.seq, f.confidence) == (
        Verdict.NOT_ENTERED, (0,), (1,), "recv", 3, "medium")
    assert f.observed == {0: None} and f.group.name == "0"
    assert f.message == ("not_entered: rank 0 has no send in flight matching rank 1's recv 0->1 (p2p seq 3) in "
                         "group 0 (default_pg, nccl)")


PP = ("3", "pp")


def _pp_collective() -> dict:
    """One finished collective in the pp group (so that resolve_groups lists the group)."""
    return entry(8, 1, pg=PP)


def test_group_ranks_in_names_are_translated_to_global_ranks():
    # pp's members are [2, 3]: its group rank 1 is global rank 3
    (f,) = _findings({2: [_pp_collective(), _p2p("send 0->1", pg=PP)], 3: [_pp_collective()]})
    assert f.ranks == (3,) and f.waiting_ranks == (2,) and "rank 3 has no recv in flight" in f.message
    assert f.group.desc == "pp" and f.group.ranks == (2, 3)



def test_a_p2p_only_group_uses_its_declared_members_to_find_the_peer():
    # pp = [2, 3], used only for send/recv: rank 2 waits in a send that rank 3 never posted
    (f,) = _findings({2: [_p2p("send 0->1", pg=PP)], 3: []})
    assert f.ranks == (3,) and f.group.desc == "pp"


def test_a_p2p_only_group_does_not_blame_the_wrong_member():
    # pp = [0, 2, 4, 6]; rank 4 (group rank 2) sends to group rank 0, i.e. global rank 0, which
    # recorded nothing in pp. Guessed from p2p mentions the members read (2, 4, 6): rank 2 is blamed.
    groups = {"0": ("default_pg", list(range(8))), "3": ("pp", [0, 2, 4, 6])}
    (f,) = _findings({0: [], 2: [_p2p("recv 1<-0", pg=PP, state="completed")], 4: [_p2p("send 2->0", pg=PP)],
                      6: [_p2p("recv 3<-2", pg=PP, state="completed")]}, groups)
    assert f.ranks == (0,) and f.waiting_ranks == (4,)


def test_the_culprits_state_is_attached_when_known():
    state = CulpritState(1, "outside_collective", "outside", "train.py:3 in f")
    (f,) = _findings({0: [_p2p("send 0->1")], 1: []}, states={1: state})
    assert f.culprit_states == (state,)


def test_a_finished_counterpart_does_not_match_an_in_flight_op():
    (f,) = _findings({0: [_p2p("send 0->1")], 1: [_p2p("recv 1<-0", state="completed")]})
    assert f.kind is Verdict.NOT_ENTERED and f.ranks == (1,)


def test_a_counterpart_in_another_group_or_direction_does_not_match():
    other_group = _findings({2: [_pp_collective(), _p2p("send 0->1", pg=PP)], 3: [_pp_collective(), _p2p("recv 3<-2")]})
    assert [f.ranks for f in other_group] == [(3,), (2,)]  # each waits for the other's group
    wrong_way = _findings({0: [_p2p("send 0->1")], 1: [_p2p("send 1->0")]})
    assert sorted(f.ranks for f in wrong_way) == [(0,), (1,)]


def test_finished_self_any_source_and_unknown_peer_ops_are_never_findings():
    assert _findings({0: [_p2p("send 0->1", state="completed")], 1: []}) == []
    assert _findings({0: [_p2p("send 0->0")], 1: []}) == []
    assert _findings({0: [_p2p("recv ?->0")], 1: []}) == []  # nothing names the sender
    assert _findings({0: [_p2p("send ?->1")], 1: []}) == []
    assert _findings({0: [_p2p("batch_isend_irecv")], 1: []}) == []  # no peers in the name


def test_a_peer_beyond_the_group_or_without_a_dump_is_left_to_other_findings():
    assert _findings({2: [_pp_collective(), _p2p("send 0->5", pg=PP)], 3: [_pp_collective()]}) == []  # 2 members
    assert _findings({0: [_p2p("send 0->3")], 1: []}) == []  # rank 3 left no dump


def test_a_matched_pair_that_disagrees_is_one_finding_naming_both():
    send = _p2p("send 0->1", p2p_seq=2)
    recv = _p2p("recv 1<-0", p2p_seq=2, size=8)
    (f,) = _findings({0: [send], 1: [recv]})
    assert (f.kind, f.ranks, f.op, f.seq, f.waiting_ranks) == (Verdict.SIZE_MISMATCH, (0, 1), "send", 2, ())
    assert f.message == ("size_mismatch: rank 0's send 0->1 (p2p seq 2) and rank 1's matching recv in group 0 "
                         "(default_pg, nccl) disagree: sizes [(4,)] vs [(8,)]")


def test_sizes_are_compared_before_dtypes_and_missing_sides_are_not_compared():
    both = _findings({0: [_p2p("send 0->1", size=8, dtype="Half")], 1: [_p2p("recv 1<-0")]})
    assert [f.kind for f in both] == [Verdict.SIZE_MISMATCH]
    dtype = _findings({0: [_p2p("send 0->1", dtype="Half")], 1: [_p2p("recv 1<-0")]})
    assert [f.kind for f in dtype] == [Verdict.DTYPE_MISMATCH] and "dtypes ['Half'] vs ['Float']" in dtype[0].message
    unrecorded = _p2p("recv 1<-0", size=8, dtype="Half")
    for key in ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes"):
        unrecorded[key] = []
    assert _findings({0: [_p2p("send 0->1")], 1: [unrecorded]}) == []


def test_a_group_nobody_declared_is_guessed_from_the_ranks_whose_p2p_mention_it():
    pg = ("9", "adhoc")  # not in pg_config: members are the ranks with p2p in it, sorted
    (f,) = _findings({1: [_p2p("send 0->1", pg=pg)], 3: [_p2p("send 0->1", pg=pg, state="completed")]},
                     groups={"0": ("default_pg", [0, 1, 2, 3])})
    assert f.group.ranks == (1, 3) and not f.group.membership_known and f.group.desc == ""
    assert f.ranks == (3,) and f.waiting_ranks == (1,)


def _gloo_pipeline(folder, stuck: int) -> None:
    """3 gloo ranks, each step: recv from the rank before, send to the next, one all_reduce. gloo
    records no send or recv: the watchdog's context.json lists the ones in flight. Rank ``stuck``
    received and never sent on; the ranks after it wait in their recv."""
    import json

    from synth import write

    groups = {"0": ("default_pg", [0, 1, 2])}
    for rank in range(3):
        write(folder, f"rank_{rank}.gloo.fr.pkl", dump(collectives(4, lib="gloo"), groups))
        waiting = rank > stuck
        context = {"rank": rank, "world_size": 3, "event": "stall-001", "reason": "stall",
                   "pg_config": {"0": {"desc": "default_pg", "ranks": [0, 1, 2]}},
                   "trace_files": [f"rank_{rank}.gloo.fr.pkl"],
                   "p2p_in_flight": [{"backend": "gloo", "group": "0", "op": "recv", "src": rank - 1, "dst": rank,
                                      "peer": rank - 1, "op_id": 13, "sizes": [[4]], "dtype": "float32",
                                      "seconds": 3.1}] if waiting else []}
        (folder / f"rank_{rank}.context.json").write_text(json.dumps(context))


def test_a_gloo_pipeline_hang_names_the_rank_that_never_sent_from_the_contexts_in_flight_ops(tmp_path):
    from lightning_ncclx.analysis import analyze_folder

    for stuck in (0, 1):
        folder = tmp_path / f"stuck{stuck}"
        _gloo_pipeline(folder, stuck)
        s = analyze_folder(folder)
        assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (stuck,), [f.message for f in s.findings]
        assert s.waiting_ranks == (stuck + 1,) and s.op == "recv"
        waiting = {row.rank: row.detail for row in s.per_rank}
        assert waiting[2].startswith("in recv 1->2")


def test_context_p2p_items_are_checked_before_use():
    from lightning_ncclx.analysis.p2p import p2p_from_context

    good = {"backend": "gloo", "group": "0", "op": "recv", "src": 0, "dst": 1, "op_id": 7, "sizes": [[4]], "dtype": "f"}
    assert p2p_from_context([good])[0][1].src == 0
    bad = [None, "x", {**good, "op": "all_reduce"}, {**good, "src": "0"}, {**good, "op_id": True},
           {**good, "backend": 3}, {**good, "group": [1]}, {**good, "dst": 1 << 50}]
    assert p2p_from_context(bad) == () and p2p_from_context({"op": "recv"}) == ()
    assert p2p_from_context([{**good, "sizes": [[1] * 40]}])[0][1].sizes == ()  # a silly shape is dropped
    assert len(p2p_from_context([good] * 1000)) == 64
