"""Root cause by program order where no majority can decide: a tie after a rank died without a
dump, and two groups waiting on each other (the bigger group's vote must not name the victim)."""

from __future__ import annotations

from synth import T0, dump, entry, write

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.analysis.order import breaks_habit, breaks_period, period_of


def _frame(line: int, func: str) -> list:
    return [{"name": "all_reduce", "filename": "site-packages/torch/distributed/distributed_c10d.py", "line": 1},
            {"name": func, "filename": "train.py", "line": line}]


def test_period_of_a_repeating_history():
    assert period_of(list("abcabcabc")) == 3 and period_of(list("abcd")) is None
    assert breaks_period(list("PWPWPWW")) == (True, "P") and breaks_period(list("PWPWPWP")) == (False, "P")


def test_two_survivors_of_three_disagree_and_the_one_breaking_its_own_period_is_named(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for rank in (1, 2):  # rank 0 died without a dump
        es, rid = [], 0
        for step in range(6):
            for k, (size, line) in enumerate(((4, 10), (8, 11))):
                seq = 2 * step + k + 1
                last = step == 5 and k == 1
                bad = last and rank == 2
                es.append(entry(rid, seq, size=2 if bad else size, state="scheduled" if last else "completed",
                                frames=_frame(20 if bad else line, "bad_step" if bad else "step")))
                rid += 1
        write(tmp_path, f"rank_{rank}.pkl", dump(es, groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.SIZE_MISMATCH and s.culprit_ranks == (2,)
    head = s.findings[0]
    assert head.confidence == "medium" and head.waiting_ranks == (1,)
    assert "rank 2 broke the pattern of its own earlier steps" in head.message
    assert "train.py:11 in step" in head.message


def test_a_habit_is_what_followed_the_previous_call_before():
    noisy = list("SABSyABSABxS")  # steps S, A, B with a warm-up call and an epoch's extra call between
    assert period_of(noisy) is None
    assert breaks_habit(noisy + ["A"]) == (False, "A")  # A followed S before
    assert breaks_habit(noisy + ["B"]) == (True, "A")  # B never followed S: it skipped A
    assert breaks_habit(list("SABSyABxS") + ["B"]) == (True, "A")  # S followed by A and y once each: B's usual predecessor
    assert breaks_habit(list("SAB") + ["B"]) is None  # too little history to know its habits
    assert breaks_habit(list("SAB")) is None and breaks_habit(list("SA")) is None


def _noisy_tie(folder, skipper: int) -> None:
    """Ranks 0 and 2 of 3 (rank 1 died without a dump). Every step: a flag broadcast, the step's
    all_reduce, the gradient all_reduce; a warm-up barrier and an epoch's broadcast break any strict
    period. At the last step rank ``skipper`` skips the step's all_reduce and meets the others' with
    its gradient all_reduce (another size)."""
    groups = {"0": ("default_pg", [0, 1, 2])}
    calls = [("broadcast", 1, 5, "main"), ("all_reduce", 3, 10, "training_step"), ("all_reduce", 99, 5, "main")]
    for rank in (0, 2):
        program = []
        for step in range(4):
            program += calls
            program += [("barrier", 0, 5, "main")] if step == 1 else [("broadcast", 7, 5, "main")] if step == 2 else []
        program += calls[:1] + (calls[2:] if rank == skipper else calls[1:2])
        es = [entry(i, i + 1, op, size=size, state="scheduled" if i == len(program) - 1 else "completed",
                    frames=_frame(line, func)) for i, (op, size, line, func) in enumerate(program)]
        write(folder, f"rank_{rank}.pkl", dump(es, groups))


def test_a_tie_in_a_history_without_a_period_is_settled_by_the_ranks_habits(tmp_path):
    _noisy_tie(tmp_path, skipper=2)
    s = analyze_folder(tmp_path)
    head = s.findings[0]
    assert s.culprit_ranks == (2,) and head.confidence == "medium" and head.waiting_ranks == (0,)
    assert "there it called all_reduce[3]/Float from train.py:10 in training_step" in head.message
    assert head.evidence[0].startswith("program order: rank 2 called all_reduce[99]/Float")
    assert s.classification.kind.value == "program_divergence"


def test_a_tie_without_a_period_still_names_nobody(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for rank in (1, 2):
        es = [entry(0, 1, size=4), entry(1, 2, size=4 if rank == 1 else 2, state="scheduled")]
        write(tmp_path, f"rank_{rank}.pkl", dump(es, groups))
    s = analyze_folder(tmp_path)
    assert s.findings[0].confidence == "low" and s.findings[0].ranks == (1, 2)


def _cycle_dumps(folder, skipper: int = 3) -> None:
    """World {0,1,2,3} and pair {2,3}; every step: pair all_reduce, then world all_reduce. At step
    5 rank ``skipper`` skips the pair's all_reduce and goes on to the world's."""
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("pair23", [2, 3])}
    for rank in range(4):
        es, rid = [], 0
        for step in range(1, 6):
            last = step == 5
            t = T0 + step * 1_000_000
            if rank in (2, 3) and not (last and rank == skipper):
                es.append(entry(rid, step, pg=("1", "pair23"), t_ns=t, state="scheduled" if last else "completed"))
                rid += 1
                if last:
                    continue  # the victim waits in the pair's all_reduce
            es.append(entry(rid, step, pg=("0", "default_pg"), t_ns=t + 500, state="scheduled" if last else "completed"))
            rid += 1
        write(folder, f"rank_{rank}.pkl", dump(es, groups))


def test_a_cross_group_cycle_blames_the_rank_that_left_its_order_not_the_bigger_groups_minority(tmp_path):
    _cycle_dumps(tmp_path)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED
    assert s.culprit_ranks == (3,), s.headline
    assert s.process_group.desc == "pair23" and s.waiting_ranks == (2,)
    assert "why rank 3: it skipped all_reduce #5 of group 1 and went on to all_reduce of group 0" in s.headline
    victim = s.findings[1]
    assert victim.ranks == (2,) and victim.group.desc == "default_pg"


def test_the_same_cycle_with_the_other_rank_skipping_names_that_rank(tmp_path):
    _cycle_dumps(tmp_path, skipper=2)
    s = analyze_folder(tmp_path)
    assert s.culprit_ranks == (2,) and s.waiting_ranks == (3,)


def _extra_call_dumps(folder, world: int, extra_rank: int, with_frames: bool = True, skip: bool = False) -> None:
    """Every step calls all_reduce from train.py:10, then from train.py:11 (same sizes). At step 4
    rank ``extra_rank`` calls one more all_reduce from train.py:30 (``skip``: it leaves out the
    one from line 11 instead). The backend pairs calls by order, so that rank runs one call ahead
    (behind) from there on; after step 6 the others are done, and it waits (they wait)."""
    groups = {"0": ("default_pg", list(range(world)))}
    for rank in range(world):
        lines: list[tuple[int, str]] = []
        for step in range(1, 7):
            lines.append((10, "step"))
            if rank == extra_rank and step == 4 and not skip:
                lines.append((30, "sync_metric"))
            if not (rank == extra_rank and step == 4 and skip):
                lines.append((11, "step"))
        if skip and rank != extra_rank:
            lines.append((10, "epoch_end"))  # the others go on into a call the skipper never answers
        es = []
        for i, (line, func) in enumerate(lines):
            last = i == len(lines) - 1
            pending = last and (rank == extra_rank) != skip
            es.append(entry(i, i + 1, state="scheduled" if pending else "completed",
                            frames=_frame(line, func) if with_frames else None))
        write(folder, f"rank_{rank}.pkl", dump(es, groups))


def test_a_rank_that_called_one_extra_collective_is_named_not_the_ranks_it_left(tmp_path):
    _extra_call_dumps(tmp_path, world=3, extra_rank=1)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.EXTRA_COLLECTIVE, s.headline
    assert s.culprit_ranks == (1,) and s.waiting_ranks == (0, 2)
    head = s.findings[0]
    assert head.seq == 8 and head.confidence == "high"
    assert "train.py:30 in sync_metric" in head.message
    assert s.classification.kind.value == "program_divergence"
    assert any("train.py:30" in a for a in s.classification.advice)


def test_an_extra_collective_in_a_two_rank_job_is_settled_by_program_order(tmp_path):
    _extra_call_dumps(tmp_path, world=2, extra_rank=0)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.EXTRA_COLLECTIVE and s.culprit_ranks == (0,), s.headline
    assert "broke the pattern of their own earlier steps" in s.findings[0].message


def test_a_two_rank_skip_still_blames_the_rank_that_skipped_with_the_reason(tmp_path):
    _extra_call_dumps(tmp_path, world=2, extra_rank=1, skip=True)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (1,), s.headline
    head = s.findings[0]
    assert head.confidence == "high" and "they skipped a collective" in head.message


def test_without_call_sites_an_extra_collective_is_not_claimed(tmp_path):
    _extra_call_dumps(tmp_path, world=3, extra_rank=1, with_frames=False)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.findings[0].confidence == "medium"


def test_call_sites_kept_for_different_windows_are_not_a_difference(tmp_path):
    """Call sites are kept for each group's newest 128 collectives: a rank one collective behind
    keeps them from one sequence id earlier, which is no evidence of another call site."""
    groups = {"0": ("default_pg", [0, 1])}
    for rank in (0, 1):
        n = 300 if rank == 0 else 299  # rank 1 never entered seq 300
        es = [entry(i, i + 1, state="scheduled" if i == n - 1 and rank == 0 else "completed",
                    frames=_frame(10, "step")) for i in range(n)]
        write(tmp_path, f"rank_{rank}.pkl", dump(es, groups))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (1,)
    assert not s.findings[0].evidence, s.findings[0].evidence


def _fsdp_like(folder, skipper: int | None, made_op: str = "_allgather_base", made_size: int = 8):
    """3 ranks, every step an all_reduce from train.py:10 then an all-gather from train.py:30 (as an
    FSDP2 forward after the step's own collective); at the sixth step ``skipper`` skips the
    all_reduce and goes on to the next call (``made_op`` / ``made_size``), which the backend pairs
    with the others' all_reduce."""
    groups = {"0": ("default_pg", [0, 1, 2])}
    for rank in range(3):
        es, rid = [], 0
        for step in range(6):
            for k, (op, size, line) in enumerate((("all_reduce", 3, 10), ("_allgather_base", 8, 30))):
                last = step == 5 and k == 0
                if last and rank == skipper:
                    op, size, line = made_op, made_size, 30 if made_op == "_allgather_base" else 40
                es.append(entry(rid, 2 * step + k + 1, op, size=size, state="scheduled" if last else "completed",
                                frames=_frame(line, "step")))
                rid += 1
                if last:
                    break
        write(folder, f"rank_{rank}.pkl", dump(es, groups))
    return folder


def test_a_rank_that_skipped_a_collective_into_its_next_call_is_named_for_the_skip(tmp_path):
    s = analyze_folder(_fsdp_like(tmp_path, 1))
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (1,) and s.waiting_ranks == (0, 2)
    assert s.classification.kind.value == "program_divergence"
    head = s.findings[0]
    assert head.message.startswith("not_entered: rank(s) 1 skipped all_reduce[3]/Float (seq 11) of group 0")
    assert "called _allgather_base[8]/Float there, the call their own earlier steps make right after it" in head.message
    assert any(e.startswith("program order: rank(s) 1 called _allgather_base") and "train.py:30 in step" in e
               for e in head.evidence)


def test_a_call_never_made_after_the_others_call_stays_an_argument_mismatch(tmp_path):
    # broadcast where the others all_reduce: not a call that follows the all_reduce in rank 1's history
    s = analyze_folder(_fsdp_like(tmp_path, 1, made_op="broadcast", made_size=3))
    assert s.verdict is Verdict.OP_MISMATCH and s.culprit_ranks == (1,)
    assert s.classification.kind.value == "argument_mismatch"
