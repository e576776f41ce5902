"""Alignment by collective sequence id on synthetic dumps (cases CPU gloo cannot produce)."""

from __future__ import annotations

from synth import collectives, dump, entry, write

from lightning_ncclx.analysis import Verdict, analyze_folder

WORLD2 = {"0": ("default_pg", [0, 1])}


def test_two_rank_op_mismatch_is_a_tie_and_says_so(tmp_path):
    for r, op in ((0, "all_reduce"), (1, "broadcast")):
        es = collectives(3)
        es.append(entry(3, 4, op, state="scheduled"))
        write(tmp_path, f"nccl_trace_rank_{r}", dump(es, WORLD2))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.OP_MISMATCH
    assert s.culprit_ranks == (0, 1) and s.findings[0].confidence == "low"
    assert "cannot tell which rank" in s.findings[0].message


def test_two_ranks_one_behind_blames_the_one_behind(tmp_path):
    write(tmp_path, "nccl_trace_rank_0", dump(collectives(5, last_state="started"), WORLD2))
    write(tmp_path, "nccl_trace_rank_1", dump(collectives(4), WORLD2))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (1,) and s.waiting_ranks == (0,)
    assert s.findings[0].culprit_states[0].state == "outside_collective"


def test_wrapped_buffers_compare_only_the_common_window(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    # rank 0 holds seq 50..100, rank 1 holds 1..100, rank 2 holds 80..99 (behind by one)
    write(tmp_path, "t_0", dump(collectives(51, start=50, last_state="scheduled"), groups))
    old = collectives(100, last_state="scheduled")
    old[10]["input_sizes"] = [[99]]  # outside rank 0's and 2's window: must not count
    write(tmp_path, "t_1", dump(old, groups))
    write(tmp_path, "t_2", dump(collectives(20, start=80), groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (2,) and s.collective_seq_id == 100


def test_matching_send_recv_pairs_are_not_findings(tmp_path):
    for r in (0, 1):
        es = collectives(3, lib="nccl2")
        op = "send 0->1" if r == 0 else "recv 1<-0"
        es += [entry(3 + i, 0, op, lib="nccl2", p2p_seq=i + 1, is_p2p=True) for i in range(3)]
        es.append(entry(6, 4, lib="nccl2"))
        write(tmp_path, f"nccl_trace_rank_{r}", dump(es, WORLD2))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NO_HANG and s.findings == ()


def test_in_flight_send_without_a_receiver_blames_the_peer(tmp_path):
    es0 = collectives(3) + [entry(3, 0, "send 0->1", p2p_seq=1, is_p2p=True, state="started")]
    write(tmp_path, "nccl_trace_rank_0", dump(es0, WORLD2))
    write(tmp_path, "nccl_trace_rank_1", dump(collectives(3), WORLD2))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (1,) and s.op == "send"


def test_missing_dump_with_everyone_else_waiting_is_dump_missing(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2, 3])}
    for r in (0, 1, 2):
        write(tmp_path, f"nccl_trace_rank_{r}", dump(collectives(4, last_state="started"), groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.DUMP_MISSING and s.culprit_ranks == (3,) and s.ranks_missing == (3,)
    assert s.findings[0].culprit_states[0].state == "no_dump"


def test_dtype_mismatch_and_global_ranks_of_a_sub_group(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "5": ("tp", [1, 3])}
    for r in range(4):
        es = collectives(2)
        if r in (1, 3):
            es.append(entry(2, 1, pg=("5", "tp"), dtype="BFloat16" if r == 3 else "Float", state="scheduled"))
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(es, groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.DTYPE_MISMATCH
    assert s.process_group.ranks == (1, 3) and s.process_group.desc == "tp"
    assert s.findings[0].confidence == "low"  # two members: a tie


def test_coalesced_entries_sharing_a_sequence_id_are_one_collective(tmp_path):
    for r in (0, 1, 2):
        es = collectives(2) + [entry(2, 3, size=4), entry(3, 3, size=8), entry(4, 3, "coalesced")]
        write(tmp_path, f"t{r}", dump(es, {"0": ("default_pg", [0, 1, 2])}))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NO_HANG


def test_all_in_flight_with_one_gpu_not_started_names_the_busy_stream(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r, state in enumerate(("started", "started", "scheduled")):
        write(tmp_path, f"nccl_trace_rank_{r}", dump(collectives(6, last_state=state), groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NO_HANG and s.findings == ()
    note = next(n for n in s.notes if "had not started it" in n)
    assert note.startswith("in seq 6 of group 0 (default_pg, nccl), rank(s) 2 enqueued the collective")
    assert "while rank(s) 0, 1 had" in note


def test_all_in_flight_and_all_scheduled_adds_no_stream_note(tmp_path):
    groups = {"0": ("default_pg", [0, 1])}
    for r in range(2):  # without NCCL timing no entry ever reads "started"
        write(tmp_path, f"nccl_trace_rank_{r}", dump(collectives(6, last_state="scheduled"), groups))
    s = analyze_folder(tmp_path)
    assert not any("had not started it" in n for n in s.notes)


def test_a_rank_with_no_entry_of_a_group_the_others_wrapped_past_is_not_blamed(tmp_path):
    from synth import entry

    groups = {"0": ("default_pg", [0, 1, 2]), "1": ("sub", [1, 2])}
    write(tmp_path, "nccl_trace_rank_0", dump(collectives(12, start=100, last_state="started"), groups))
    write(tmp_path, "nccl_trace_rank_1", dump(collectives(12, start=100, last_state="started"), groups))
    # rank 2's buffer holds only the sub-group's newest entries: the default group's were evicted
    write(tmp_path, "nccl_trace_rank_2", dump([entry(i, 200 + i, pg=("1", "sub")) for i in range(20)], groups))
    s = analyze_folder(tmp_path)  # used to crash (StopIteration): nobody holds seq 1 any more
    assert 2 not in s.culprit_ranks
    assert any("rank(s) 2 hold no entry of group 0" in n for n in s.notes)


def test_a_rank_behind_everyone_elses_window_is_behind_with_low_confidence(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in (0, 1):
        write(tmp_path, f"nccl_trace_rank_{r}", dump(collectives(12, start=100, last_state="started"), groups))
    write(tmp_path, "nccl_trace_rank_2", dump(collectives(50), groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (2,)
    assert s.findings[0].confidence == "low" and s.collective_seq_id == 51


def test_entries_out_of_sequence_order_are_aligned_by_sequence_id(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in (0, 1):
        es = collectives(6, last_state="started")
        write(tmp_path, f"nccl_trace_rank_{r}", dump(es[::-1] if r == 0 else es, groups))
    write(tmp_path, "nccl_trace_rank_2", dump(collectives(5), groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (2,) and s.collective_seq_id == 6


def _with_context(folder, rank, world):
    import json

    (folder / f"rank_{rank:05d}.context.json").write_text(json.dumps({"rank": rank, "world_size": world}))


def test_a_few_dumps_of_a_huge_world_stay_small_and_a_corrupt_world_size_is_not_believed(tmp_path):
    groups = {"0": ("default_pg", [0, 1])}
    for r, n in ((0, 6), (1, 5)):
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(n, last_state="started"), groups))
    _with_context(tmp_path, 0, 200_000)
    _with_context(tmp_path, 1, 10**12)  # corrupt: used to try to build 10**12 rank states
    s = analyze_folder(tmp_path)
    assert s.context["world_size"] == 200_000 and len(s.ranks_missing) == 199_998
    assert len(s.per_rank) <= 2 + 1000 + len(s.culprit_ranks)
    assert {0, 1} <= {row.rank for row in s.per_rank}


def test_a_rank_that_only_enqueued_more_does_not_make_the_others_culprits(tmp_path):
    """NCCL collectives are asynchronous: rank 0 enqueued seq 7 and 8 while seq 6 has not
    finished anywhere. Ranks 1 and 2 are not 'behind': everyone waits for seq 6."""
    groups = {"0": ("default_pg", [0, 1, 2])}
    ahead = collectives(8, last_state="scheduled")
    for e in ahead[5:]:
        e["state"], e["retired"] = "scheduled", False
    write(tmp_path, "nccl_trace_rank_0", dump(ahead, groups))
    for r in (1, 2):
        write(tmp_path, f"nccl_trace_rank_{r}", dump(collectives(6, last_state="started"), groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NO_HANG and s.findings == ()
    assert any("(seq 6)" in n and "has not finished" in n for n in s.notes), s.notes


def test_a_rank_behind_a_finished_collective_is_still_the_culprit(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in (0, 1):
        write(tmp_path, f"nccl_trace_rank_{r}", dump(collectives(8, last_state="started"), groups))
    write(tmp_path, "nccl_trace_rank_2", dump(collectives(6), groups))  # finished 6, never entered 7
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (2,) and s.collective_seq_id == 7


# Each op's own rules, and point-to-point pairs (cases from torch's analyzer tests, Op.match).
WORLD3 = {"0": ("default_pg", [0, 1, 2])}


def _same_everywhere(folder, last: dict) -> None:
    for r in range(3):
        es = collectives(3)
        e = entry(3, 4, last.get("op", "all_reduce"), state="scheduled")
        e.update({k: v for k, v in last.items() if k != "op"})
        write(folder, f"rank_{r}.pkl", dump(es + [e], WORLD3))


def test_all_reduce_output_differing_from_input_breaks_its_rule_even_when_all_ranks_agree(tmp_path):
    _same_everywhere(tmp_path, {"output_sizes": [[2]]})
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.SIZE_MISMATCH and s.collective_seq_id == 4
    assert "all_reduce output sizes must equal its input sizes" in s.headline
    assert "all_reduce[4->2]/Float" in s.headline


def test_all_gather_output_must_be_input_times_group_size(tmp_path):
    _same_everywhere(tmp_path / "bad", {"op": "_all_gather_base", "output_sizes": [[8]]})
    s = analyze_folder(tmp_path / "bad")
    assert s.verdict is Verdict.SIZE_MISMATCH and "x group size (4 x 3 = 12, not 8)" in s.headline
    _same_everywhere(tmp_path / "list", {"op": "all_gather", "output_sizes": [[4], [4]], "output_dtypes": ["Float"] * 2})
    assert "one tensor per rank (3), not 2" in analyze_folder(tmp_path / "list").headline
    for name, out in (("flat", [[12]]), ("listed", [[4], [4], [4]])):
        _same_everywhere(tmp_path / name, {"op": "all_gather_into_tensor", "output_sizes": out})
        assert analyze_folder(tmp_path / name).verdict is not Verdict.SIZE_MISMATCH


def test_reduce_scatter_input_must_be_output_times_group_size(tmp_path):
    _same_everywhere(tmp_path, {"op": "reduce_scatter_tensor", "input_sizes": [[10]]})
    assert "reduce_scatter input element count" in analyze_folder(tmp_path).headline


def test_completed_on_some_ranks_and_pending_on_others_is_a_state_mismatch(tmp_path):
    for r in range(3):
        es = collectives(4, last_state="completed" if r == 0 else "scheduled")
        write(tmp_path, f"rank_{r}.pkl", dump(es, WORLD3))
    s = analyze_folder(tmp_path)
    assert any("state mismatch at seq 4" in n and "pending on rank(s) 1, 2" in n for n in s.notes), s.notes


def _p2p_pair(folder, send: dict, recv_name: str, recv: dict) -> None:
    for r in (0, 1):
        es = collectives(3, lib="nccl2")
        e = entry(3, 0, "send 0->1" if r == 0 else recv_name, lib="nccl2", p2p_seq=1, is_p2p=True, state="scheduled")
        e.update(send if r == 0 else recv)
        write(folder, f"rank_{r}.pkl", dump(es + [e], WORLD2))


def test_any_source_recv_matches_a_send(tmp_path):
    _p2p_pair(tmp_path, {}, "recv ?->1", {})
    assert analyze_folder(tmp_path).findings == ()


def test_send_recv_with_different_sizes_is_a_size_mismatch_not_not_entered(tmp_path):
    _p2p_pair(tmp_path, {}, "recv 1<-0", {"input_sizes": [[8]], "output_sizes": [[8]]})
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.SIZE_MISMATCH and s.culprit_ranks == (0, 1)
    assert "sizes [(4,)] vs [(8,)]" in s.headline
    _p2p_pair(tmp_path / "d", {}, "recv 1<-0", {"input_dtypes": ["Half"], "output_dtypes": ["Half"]})
    assert analyze_folder(tmp_path / "d").verdict is Verdict.DTYPE_MISMATCH
