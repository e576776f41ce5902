"""The analyzer on REAL gloo dumps: 3 ranks, rank 2 misbehaves (see gloo_worker.py)."""

from __future__ import annotations

import pytest

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.report import render_text

LAYOUTS = ("ours", "torch")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_healthy_job_says_no_hang(gloo_dumps, layout):
    s = analyze_folder(gloo_dumps["healthy"] / layout)
    assert s.verdict is Verdict.NO_HANG
    assert s.culprit_ranks == () and s.findings == ()
    assert s.ranks_seen == (0, 1, 2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rank_dependent_sizes_of_gather_scatter_and_all_to_all_are_not_a_mismatch(gloo_dumps, layout):
    # gather/scatter roots record buffers the other ranks do not; all_to_all splits differ per rank
    s = analyze_folder(gloo_dumps["uneven"] / layout)
    assert s.verdict is Verdict.NO_HANG, s.findings
    assert s.findings == ()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_skip_after_rank_dependent_collectives_still_blames_the_rank_that_skipped(gloo_dumps, layout):
    s = analyze_folder(gloo_dumps["uneven_skip"] / layout)
    assert s.verdict is Verdict.NOT_ENTERED
    assert s.culprit_ranks == (2,) and s.waiting_ranks == (0, 1)
    assert s.op == "all_reduce"


def test_groups_called_in_opposite_order_name_the_odd_rank_and_the_cycle(gloo_dumps):
    s = analyze_folder(gloo_dumps["order"] / "ours")
    assert s.verdict is Verdict.NOT_ENTERED
    assert s.culprit_ranks == (2,) and s.waiting_ranks == (0, 1)
    head = s.findings[0]
    assert head.culprit_states[0].state == "in_collective"
    assert head.evidence[0].startswith("deadlock across groups: rank(s) 2 wait in all_reduce of group ")
    assert "for rank(s) 0, 1" in head.evidence[0]
    assert "deadlock across groups" in render_text(s).split("ranks seen")[0]


def test_raw_gloo_dumps_do_not_claim_a_group_of_unknown_members_is_complete(gloo_dumps):
    # gloo's raw pg_config does not declare sub-groups: only rank 2 recorded in the second group
    s = analyze_folder(gloo_dumps["order"] / "torch")
    assert s.culprit_ranks == (2,)
    assert not any("no rank is missing" in n for n in s.notes)
    assert any("whose members are unknown" in n for n in s.notes), s.notes


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rank_stuck_outside_collectives_is_not_entered_with_its_stack_frame(gloo_dumps, layout):
    s = analyze_folder(gloo_dumps["outside"] / layout)
    assert s.verdict is Verdict.NOT_ENTERED
    assert s.culprit_ranks == (2,) and s.waiting_ranks == (0, 1)
    assert s.op == "all_reduce" and s.collective_seq_id == 4
    state = s.findings[0].culprit_states[0]
    assert state.state == "outside_collective"
    if layout == "ours":  # the plugin's layout has rank_<R>.stacks.txt: the main thread's user frame
        assert "wait_outside_collectives" in state.location


@pytest.mark.parametrize("layout", LAYOUTS)
def test_skipped_all_reduce_blames_the_rank_that_is_behind_and_shows_call_sites(gloo_dumps, layout):
    s = analyze_folder(gloo_dumps["skip"] / layout)
    assert s.verdict is Verdict.NOT_ENTERED
    assert s.culprit_ranks == (2,) and s.waiting_ranks == (0, 1)
    assert s.collective_seq_id == 6
    evidence = " ".join(s.findings[0].evidence)
    assert "call sites first differ at seq 5" in evidence and "step_b" in evidence and "step_a" in evidence


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_extra_all_reduce_names_the_rank_that_called_it_not_the_ranks_it_left(gloo_dumps, layout):
    s = analyze_folder(gloo_dumps["extra"] / layout)
    assert s.verdict is Verdict.EXTRA_COLLECTIVE, s.headline
    assert s.culprit_ranks == (2,) and s.waiting_ranks == (0, 1)
    head = s.findings[0]
    assert head.seq == 11 and head.confidence == "high"  # 3 warm-up calls, then step_a/step_b x3, then the extra
    assert "in sync_metric" in head.message
    assert s.classification.kind.value == "program_divergence"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_different_collective_is_op_mismatch_with_culprit_frame(gloo_dumps, layout):
    s = analyze_folder(gloo_dumps["op"] / layout)
    assert s.verdict is Verdict.OP_MISMATCH
    assert s.culprit_ranks == (2,)
    f = s.findings[0]
    assert f.observed[2][0] == "broadcast" and f.expected[0] == "all_reduce"
    assert f.culprit_states[0].state == "in_collective"
    assert "gloo_worker.py" in f.culprit_states[0].location


def test_smaller_tensor_is_size_mismatch(gloo_dumps):
    s = analyze_folder(gloo_dumps["size"] / "ours")
    assert s.verdict is Verdict.SIZE_MISMATCH
    assert s.culprit_ranks == (2,)
    d = s.to_dict()["findings"][0]
    assert d["sizes"] == [[4]] and d["observed"]["2"]["input_sizes"] == [[2]]


def test_sub_group_root_cause_comes_before_its_consequence(gloo_dumps):
    s = analyze_folder(gloo_dumps["subgroup"] / "ours")
    assert s.verdict is Verdict.NOT_ENTERED
    assert s.culprit_ranks == (2,)
    assert s.process_group.ranks == (1, 2)
    # the default group also waits, on ranks 1 (in the sub-group's collective) and 2
    later = s.findings[1]
    assert later.group.desc == "default_pg" and later.ranks == (1, 2)
    assert {c.rank: c.state for c in later.culprit_states} == {1: "in_collective", 2: "outside_collective"}


def test_raw_gloo_sub_group_without_pg_config_still_points_at_the_idle_rank(gloo_dumps):
    # raw gloo pg_config is useless (its "" key even holds group-local ranks), and rank 2 never
    # recorded anything in the sub-group: only the default group shows it, next to rank 1
    s = analyze_folder(gloo_dumps["subgroup"] / "torch")
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (1, 2)
    states = {c.rank: c for c in s.findings[0].culprit_states}
    assert states[2].state == "outside_collective"
    assert states[1].state == "in_collective" and "group 1" in states[1].detail


def test_wrapped_ring_buffers_with_sub_groups_still_find_the_odd_rank(gloo_dumps):
    s = analyze_folder(gloo_dumps["wrap"] / "ours")
    assert s.verdict is Verdict.OP_MISMATCH
    assert s.culprit_ranks == (2,) and s.waiting_ranks == (0, 1)


def test_our_layout_reports_hosts_and_dump_locations(gloo_dumps):
    s = analyze_folder(gloo_dumps["outside"] / "ours")
    assert s.hosts == {0: "host0", 1: "host0", 2: "host1"}
    assert set(s.dump_locations) == {"host0", "host1"}
    assert s.to_dict()["context"]["event"] == "stall-001"


def test_stragglers_are_reported_per_group(gloo_dumps):
    s = analyze_folder(gloo_dumps["healthy"] / "ours")
    assert s.stragglers and all(x.group == "0" and x.samples >= 3 for x in s.stragglers)
