"""An exception names the rank that raised it: a peer dumped just before the collective the
raising rank never reached is no co-culprit (synthetic dumps of that moment)."""

from __future__ import annotations

import json
from pathlib import Path

from synth import collectives, dump, write

from lightning_ncclx.analysis import analyze_folder

GROUPS = {"0": ("default_pg", [0, 1, 2])}


def _moment_after_rank_1_raised(folder: Path, exceptions: dict[int, str]) -> None:
    """Rank 0 waits in all_reduce seq 5; ranks 1 and 2 finished seq 4 and are outside any collective."""
    for rank in range(3):
        entries = collectives(5, last_state="started") if rank == 0 else collectives(4)
        write(folder, f"rank_{rank:05d}.nccl.fr.pkl", dump(entries, GROUPS))
        context = {"rank": rank, "host": "node-a", "world_size": 3, "phase": "train_step", "event": "exception-001",
                   "reason": "exception" if rank in exceptions else "peer_request", "initiator_rank": 1}
        if rank in exceptions:
            context["exception"] = exceptions[rank]
        (folder / f"rank_{rank:05d}.context.json").write_text(json.dumps(context))


def test_only_the_rank_that_raised_is_the_culprit(tmp_path: Path) -> None:
    _moment_after_rank_1_raised(tmp_path, {1: "RuntimeError: injected failure"})
    summary = analyze_folder(tmp_path).to_dict()
    assert summary["culprit_ranks"] == [1], summary["culprit_ranks"]
    head = summary["findings"][0]
    assert head["ranks"] == [1] and head["waiting_ranks"] == [0]
    assert [c["rank"] for c in head["culprit_states"]] == [1]
    assert any("rank(s) 2 had not reached all_reduce (seq 5)" in e for e in head["evidence"]), head["evidence"]
    assert "rank(s) 1 raised an exception" in head["message"]
    assert summary["restart_advice"]["action"] == "do_not_restart"


def test_without_an_exception_both_ranks_outside_stay_culprits(tmp_path: Path) -> None:
    _moment_after_rank_1_raised(tmp_path, {})
    assert analyze_folder(tmp_path).to_dict()["culprit_ranks"] == [1, 2]


def test_every_rank_that_raised_stays_a_culprit(tmp_path: Path) -> None:
    _moment_after_rank_1_raised(tmp_path, {1: "RuntimeError: a", 2: "ValueError: b"})
    assert analyze_folder(tmp_path).to_dict()["culprit_ranks"] == [1, 2]


def test_a_rank_that_raised_before_any_peer_waited_is_still_the_culprit(tmp_path: Path) -> None:
    """Every rank finished seq 4 and none had entered seq 5 when it dumped (the peers were still in
    their own step, a busy host): the dumps agree, no rank waits, and yet the event is rank 1's
    exception, which the others will wait for. It names rank 1; the verdict stays no_hang."""
    for rank in range(3):
        write(tmp_path, f"rank_{rank:05d}.nccl.fr.pkl", dump(collectives(4), GROUPS))
        context = {"rank": rank, "host": "node-a", "world_size": 3, "phase": "train_step", "event": "exception-001",
                   "reason": "exception" if rank == 1 else "peer_request", "initiator_rank": 1}
        if rank == 1:
            context["exception"] = "RuntimeError: injected failure"
        (tmp_path / f"rank_{rank:05d}.context.json").write_text(json.dumps(context))
    summary = analyze_folder(tmp_path).to_dict()
    assert summary["culprit_ranks"] == [1] and summary["findings"] == [], summary
    assert summary["verdict"] == "no_hang"
    assert summary["restart_advice"]["action"] == "do_not_restart"
    assert summary["hang_kind"] == "no_hang" and "rank 1" in summary["hang_kind_reason"], summary["hang_kind_reason"]
