"""diagnose: the rules between alignment and the Summary. Which mismatch kind odd signatures make
(``classify_mismatch``), the completed-here-pending-there note, how findings are ranked
(``_priority``), how a rank alive without a dump is described, and what ``analyze`` makes of
ranks whose process had gone or stayed silent, of an empty folder, loader warnings, digests and
context extras. End-to-end verdicts on synthetic dumps live in test_align / test_order."""

from __future__ import annotations

from synth import T0, collectives, dump, entry

from lightning_ncclx.analysis.diagnose import _priority, _silent_detail, analyze, classify_mismatch, state_mismatch
from lightning_ncclx.analysis.model import (CulpritState, Finding, GroupRef, LoadedFolder, RankContext, Verdict)
from lightning_ncclx.analysis.parse import build_trace

AR4 = ("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))
AR8 = ("all_reduce", ((8,),), ("Float",), ((8,),), ("Float",))
AR4_OUT8 = ("all_reduce", ((4,),), ("Float",), ((8,),), ("Float",))
AR4_HALF = ("all_reduce", ((4,),), ("Half",), ((4,),), ("Half",))
AR4_OUT_HALF = ("all_reduce", ((4,),), ("Float",), ((4,),), ("Half",))
BC4 = ("broadcast", ((4,),), ("Float",), ((4,),), ("Float",))


# --- classify_mismatch -------------------------------------------------------------------------

def test_the_odd_ranks_signature_decides_the_kind():
    assert classify_mismatch(AR4, {0: AR4, 1: BC4}, (1,)) is Verdict.OP_MISMATCH
    assert classify_mismatch(AR4, {0: AR4, 1: AR8}, (1,)) is Verdict.SIZE_MISMATCH
    assert classify_mismatch(AR4, {0: AR4, 1: AR4_OUT8}, (1,)) is Verdict.SIZE_MISMATCH  # output sizes count
    assert classify_mismatch(AR4, {0: AR4, 1: AR4_HALF}, (1,)) is Verdict.DTYPE_MISMATCH
    assert classify_mismatch(AR4, {0: AR4, 1: AR4_OUT_HALF}, (1,)) is Verdict.DTYPE_MISMATCH  # output dtypes too
    assert classify_mismatch(AR4, {0: AR4, 1: None}, (1,)) is Verdict.NOT_ENTERED


def test_the_most_specific_kind_among_several_odd_ranks_wins():
    sigs = {0: AR4, 1: AR4, 2: AR4_HALF, 3: AR8, 4: None}
    assert classify_mismatch(AR4, sigs, (2, 3, 4)) is Verdict.SIZE_MISMATCH
    assert classify_mismatch(AR4, {**sigs, 5: BC4}, (2, 3, 4, 5)) is Verdict.OP_MISMATCH


def test_a_tie_compares_every_signature_with_the_first_present():
    assert classify_mismatch(None, {0: None, 1: AR4, 2: AR4_HALF}, (0, 1, 2)) is Verdict.DTYPE_MISMATCH
    assert classify_mismatch(None, {0: AR4, 1: None}, (0, 1)) is Verdict.NOT_ENTERED
    assert classify_mismatch(None, {0: None, 1: None}, (0, 1)) is Verdict.NOT_ENTERED


def test_odd_ranks_identical_to_the_majority_read_not_entered():
    assert classify_mismatch(AR4, {0: AR4, 1: AR4}, (1,)) is Verdict.NOT_ENTERED


# --- state_mismatch ----------------------------------------------------------------------------

WORLD3 = {"0": ("default_pg", [0, 1, 2])}
GROUP3 = GroupRef("0", "default_pg", (0, 1, 2), "nccl")


def _trace(rank: int, entries: list, groups: dict = WORLD3):
    return build_trace(dump(entries, groups), rank, f"rank_{rank}.pkl")


def test_completed_on_some_ranks_and_pending_on_others_is_noted_with_both_lists():
    tracks = {r: _trace(r, collectives(4, last_state=s)).groups["0"]
              for r, s in ((0, "completed"), (1, "scheduled"), (2, "completed"))}
    assert state_mismatch(GROUP3, tracks, 4) == (
        "state mismatch at seq 4 of group 0 (default_pg, nccl): completed on rank(s) 0, 2, still pending on rank(s) "
        "1: look at the pending ranks (their device or stream has not run it)")


def test_no_state_note_when_all_agree_or_the_seq_is_not_held():
    pending = {r: _trace(r, collectives(4, last_state="started")).groups["0"] for r in range(3)}
    assert state_mismatch(GROUP3, pending, 4) is None
    assert state_mismatch(GROUP3, pending, 3) is None  # completed everywhere
    mixed = {0: _trace(0, collectives(4)).groups["0"], 1: _trace(1, collectives(3, last_state="started")).groups["0"]}
    assert state_mismatch(GROUP3, mixed, 4) is None  # rank 1 never had seq 4: nothing pending there


# --- _priority ---------------------------------------------------------------------------------

def _f(kind: Verdict, name: str, states: tuple = (), time_ns: int = 0, confidence: str = "high", seq: int = 1,
       lib: str = "nccl") -> Finding:
    ranks = tuple(c.rank for c in states) or (9,)
    return Finding(kind, ranks, GroupRef(name, "", (0, 1), lib), seq, "all_reduce", None, {}, (), states, name,
                   confidence, time_ns)


def _state(rank: int, state: str, group: tuple | None = None) -> CulpritState:
    return CulpritState(rank, state, state, None, group)


def _ranked(findings: list[Finding], roots: frozenset = frozenset()) -> list[str]:
    stuck = {(f.group.lib, f.group.name) for f in findings}
    return [f.message for f in sorted(findings, key=lambda f: _priority(f, stuck, roots))]


def test_priority_mismatch_then_outside_then_gone_then_missing_then_in_collective_then_consequence():
    findings = [
        _f(Verdict.NOT_ENTERED, "consequence", (_state(1, "in_collective", ("nccl", "mismatch")),)),
        _f(Verdict.NOT_ENTERED, "in_coll", (_state(2, "in_collective", ("nccl", "elsewhere")),)),
        _f(Verdict.DUMP_MISSING, "missing", (_state(3, "no_dump"),)),
        _f(Verdict.DUMP_MISSING, "gone", (_state(4, "process_gone"),), time_ns=5),
        _f(Verdict.NOT_ENTERED, "outside", (_state(5, "outside_collective"),), time_ns=9),
        _f(Verdict.EXTRA_COLLECTIVE, "mismatch", time_ns=20),
    ]
    assert _ranked(findings) == ["mismatch", "gone", "outside", "missing", "in_coll", "consequence"]


def test_priority_within_a_rank_high_confidence_then_earliest_unknown_time_last():
    findings = [_f(Verdict.SIZE_MISMATCH, "late", time_ns=T0 + 5), _f(Verdict.OP_MISMATCH, "untimed"),
                _f(Verdict.DTYPE_MISMATCH, "early", time_ns=T0 + 1),
                _f(Verdict.OP_MISMATCH, "unsure", time_ns=T0, confidence="low")]
    assert _ranked(findings) == ["early", "late", "untimed", "unsure"]


def test_priority_of_missing_dumps_prefers_the_group_used_most_recently():
    findings = [_f(Verdict.DUMP_MISSING, "older", time_ns=T0 + 1), _f(Verdict.DUMP_MISSING, "newer", time_ns=T0 + 9)]
    assert _ranked(findings) == ["newer", "older"]


def test_the_root_of_a_cycle_comes_before_any_mismatch():
    root = _f(Verdict.NOT_ENTERED, "root", (_state(1, "in_collective", ("nccl", "x")),), seq=7)
    mismatch = _f(Verdict.OP_MISMATCH, "mismatch", time_ns=1)
    assert _ranked([mismatch, root], frozenset({("nccl", "root", 7)})) == ["root", "mismatch"]
    assert _ranked([mismatch, root], frozenset({("nccl", "root", 8)})) == ["mismatch", "root"]  # other seq


# --- _silent_detail ----------------------------------------------------------------------------

def test_a_silent_rank_is_described_by_its_process_state():
    stopped = _silent_detail({"pid": 41, "host": "node-b", "state": "T"})
    assert stopped == ("no dump, but its process was alive: pid 41 on node-b, state T: stopped (SIGSTOP, or a "
                       "debugger attached); `py-spy dump --native --pid 41` on that host shows where")
    assert "state D: in uninterruptible sleep" in _silent_detail({"pid": 1, "host": "h", "state": "D"})
    assert "state t: stopped by a debugger" in _silent_detail({"pid": 1, "host": "h", "state": "t"})
    running = _silent_detail({"pid": 7, "state": "S"})
    assert "pid 7 on ?, state S: running or sleeping, yet its watchdog thread could not run" in running
    assert "pid None on ?, state ?:" in _silent_detail({})


# --- analyze -----------------------------------------------------------------------------------

def _loaded(traces: tuple, **kw) -> LoadedFolder:
    return LoadedFolder(kw.pop("root", "dumps"), traces, kw.pop("contexts", {}), kw.pop("stacks", {}), (), {}, **kw)


def _waiting_for_rank_2() -> tuple:
    return tuple(_trace(r, collectives(4, last_state="started")) for r in (0, 1))


def test_a_rank_whose_process_had_gone_is_dump_missing_with_high_confidence():
    s = analyze(_loaded(_waiting_for_rank_2(), gone_ranks=(2,)))
    assert s.verdict is Verdict.DUMP_MISSING and s.culprit_ranks == (2,) and s.waiting_ranks == (0, 1)
    head = s.findings[0]
    assert head.confidence == "high" and [c.state for c in head.culprit_states] == ["process_gone"]
    assert head.message.startswith("dump_missing: in group 0 (default_pg, nccl), the process of rank(s) 2 had "
                                   "exited when the dumps were collected")
    assert head.message.endswith("; the dumped ranks are in all_reduce (seq 4)")


def test_a_rank_alive_without_a_dump_is_no_answer_with_its_process_state():
    s = analyze(_loaded(_waiting_for_rank_2(), silent_ranks={2: {"pid": 99, "host": "node-c", "state": "T"}}))
    head = s.findings[0]
    assert s.verdict is Verdict.DUMP_MISSING and head.confidence == "high"
    assert head.culprit_states[0].state == "no_answer"
    assert "rank(s) 2 did not dump although alive (rank 2: pid 99 on node-c, state T: stopped" in head.message
    assert s.per_rank[2].state == "no_answer"


def test_a_gone_rank_that_did_dump_keeps_its_dumped_state():
    traces = _waiting_for_rank_2() + (_trace(2, collectives(3)),)
    s = analyze(_loaded(traces, gone_ranks=(2,)))
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (2,)
    assert s.findings[0].culprit_states[0].state == "outside_collective"


def test_a_missing_dump_without_process_news_is_medium_confidence():
    s = analyze(_loaded(_waiting_for_rank_2()))
    head = s.findings[0]
    assert s.verdict is Verdict.DUMP_MISSING and head.confidence == "medium"
    assert head.message == ("dump_missing: rank(s) 2 of group 0 (default_pg, nccl) left no dump; the dumped ranks are "
                            "in all_reduce (seq 4): a rank that never entered a collective may never dump (nccl2)")


def test_a_missing_dump_while_the_others_agree_says_so_and_takes_their_newest_time():
    traces = tuple(_trace(r, collectives(4)) for r in (0, 1))
    s = analyze(_loaded(traces))
    head = s.findings[0]
    assert s.verdict is Verdict.DUMP_MISSING and head.seq == 4 and head.time_ns == T0 + 3000
    assert "left no dump, and the dumped ranks agree with each other (last: all_reduce, seq 4)" in head.message


def test_an_empty_folder_is_no_hang_with_a_note_and_the_loader_warnings_follow():
    s = analyze(_loaded((), warnings=("rank_3.pkl says rank 4",)))
    assert s.verdict is Verdict.NO_HANG and s.findings == () and s.ranks_seen == ()
    assert s.notes == ("no readable flight-recorder dump found", "rank_3.pkl says rank 4")
    assert s.headline == "no readable flight-recorder dump found"


def test_digest_only_ranks_are_noted_apart_from_full_dumps():
    traces = tuple(_trace(r, collectives(4)) for r in range(3))
    s = analyze(_loaded(traces, digest_only_ranks=(1, 2)))
    assert s.verdict is Verdict.NO_HANG
    assert any(n.startswith("full dumps of rank(s) 0; digests only of rank(s) 1, 2 (their newest collectives")
               for n in s.notes), s.notes


def test_every_rank_in_flight_is_no_hang_with_a_note_to_look_below_the_collective():
    traces = tuple(_trace(r, collectives(4, last_state="started")) for r in range(3))
    s = analyze(_loaded(traces))
    assert s.verdict is Verdict.NO_HANG and s.findings == () and s.culprit_ranks == ()
    assert s.classification.kind.value == "collective_stalled"
    assert s.notes[0] == ("all 3 dumped rank(s) of group 0 (default_pg, nccl) entered all_reduce (seq 4) and it has not "
                          "finished: no rank is missing from it; if this is a hang, look below the collective (GPU "
                          "kernel, network)")


def test_several_odd_ranks_with_different_calls_are_each_named():
    groups = {"0": ("default_pg", [0, 1, 2, 3, 4])}
    traces = []
    for r in range(5):
        es = collectives(3, last_state="started")
        if r == 3:
            es[-1]["input_sizes"] = es[-1]["output_sizes"] = [[8]]
        if r == 4:
            es[-1]["profiling_name"] = "nccl:broadcast"
        traces.append(_trace(r, es, groups))
    s = analyze(_loaded(tuple(traces)))
    assert s.verdict is Verdict.OP_MISMATCH and s.culprit_ranks == (3, 4) and s.waiting_ranks == (0, 1, 2)
    assert s.headline == ("op_mismatch: rank(s) 3, 4 called rank 3: all_reduce[8]/Float; rank 4: broadcast[4]/Float at "
                          "seq 3 of group 0 (default_pg, nccl) where the others called all_reduce[4]/Float")


def test_context_extras_collect_the_contexts_and_the_dumps_backends_and_versions():
    traces = tuple(_trace(r, collectives(2), {"0": ("default_pg", [0, 1])}) for r in range(2))
    contexts = {r: RankContext(r, f"c{r}", host=f"h{r}", world_size=2, phase="fit", step=10 + r, reason="stall",
                               event="stall-001", exception="Boom" if r else None, initiator_rank=1)
                for r in range(2)}
    s = analyze(_loaded(traces, contexts=contexts))
    assert s.context == {"world_size": 2, "event": "stall-001", "reason": "stall", "initiator_rank": 1,
                         "phase_by_rank": {"0": "fit", "1": "fit"}, "step_by_rank": {"0": 10, "1": 11},
                         "exceptions": {"1": "Boom"}, "backends": ["nccl"], "versions": ["2.10"]}
    assert s.hosts == {0: "h0", 1: "h1"} and [row.host for row in s.per_rank] == ["h0", "h1"]
    assert [(i.rank, i.backend, i.entries) for i in s.inputs] == [(0, "nccl", 2), (1, "nccl", 2)]


def test_a_rule_broken_at_the_mismatch_itself_is_not_reported_twice():
    traces = []
    for r in range(3):
        es = collectives(3, last_state="started")
        if r == 2:  # breaks all_reduce's own rule, and differs from the others there
            es[-1]["output_sizes"] = [[2]]
        traces.append(_trace(r, es))
    s = analyze(_loaded(tuple(traces)))
    assert [(f.kind, f.seq, f.ranks) for f in s.findings] == [(Verdict.SIZE_MISMATCH, 3, (2,))]
    assert "where the others called all_reduce[4]/Float" in s.headline


def test_a_p2p_only_hang_is_found_besides_healthy_collectives():
    groups = {"0": ("default_pg", [0, 1])}
    send = entry(2, 0, "send 0->1", p2p_seq=1, is_p2p=True, state="started")
    s = analyze(_loaded((_trace(0, collectives(2) + [send], groups), _trace(1, collectives(2), groups))))
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (1,) and s.op == "send"
