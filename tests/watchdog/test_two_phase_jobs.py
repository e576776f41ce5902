"""The two-phase gather in real jobs with node-local dump folders (no rank sees another's files):
digests first, then full dumps from the culprits and two peers. Outcomes only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from watchdog.harness import STALL_EXIT_CODE, assert_culprit, run_job, run_ranks_by_hand

pytestmark = pytest.mark.timeout(300)


def test_an_8_rank_stall_gets_the_full_gathers_verdict_from_digests_and_three_full_dumps(tmp_path: Path) -> None:
    """Rank 5 sleeps in training_step: the verdict the full gather gives (test_stall_jobs:
    not_entered, culprit 5, stuck_outside_collective), with rank 5's full dump pulled and most
    ranks read from their digests."""
    result = run_job(tmp_path, "--devices", "8", "--fault", "stuck_train", "--fault-rank", "5", "--strategy",
                     "ddp_ncclx", "--node-local", "--two-phase", timeout=240)
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    events = result.events()
    initiator_folders = [e for e in events if (e / "summary.json").is_file()]
    assert len(initiator_folders) == 1, events
    folder = initiator_folders[0]
    summary = assert_culprit(folder, 5, result.log)
    assert (summary["verdict"], summary["culprit_ranks"], summary["hang_kind"]) == (
        "not_entered", [5], "stuck_outside_collective")
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["gather"] == "two_phase" and collection["missing_ranks"] == []
    initiator = collection["initiator_rank"]  # whichever rank noticed first, the culprit included
    digest_only = collection["digest_only_ranks"]
    full = sorted(set(range(8)) - set(digest_only))
    assert {5, initiator} <= set(full) and len(full) == len({5, initiator}) + 2, collection
    assert len(digest_only) == 8 - len(full) >= 4  # own, the culprit, two peers in full; the rest digests
    assert any(f"digests only of rank(s) {', '.join(map(str, digest_only))}" in note
               for note in summary["notes"]), summary["notes"]
    assert "two-phase gather: full dumps pulled from rank(s)" in result.log


def test_a_lost_rank_is_still_lost_with_a_two_phase_gather(tmp_path: Path) -> None:
    """Rank 2 is SIGKILLed mid-step: no dump, no digest; the others' digests name it."""
    result = run_ranks_by_hand(tmp_path, 4, "--fault", "die", "--fault-rank", "2", "--strategy", "ddp_ncclx",
                               "--node-local", "--two-phase")
    assert result.returncode is not None, result.log[-6000:]
    folders = [e for e in result.events("exception-") if (e / "summary.json").is_file()]
    assert len(folders) == 1, f"{result.events()}\n{result.log[-6000:]}"
    collection = json.loads((folders[0] / "collection.json").read_text())
    assert collection["gather"] == "two_phase"
    assert collection["missing_ranks"] == [2] and collection["gone_ranks"] == [2], collection
    summary = assert_culprit(folders[0], 2, result.log)
    assert summary["verdict"] == "dump_missing"
    assert [c["state"] for c in summary["findings"][0]["culprit_states"]] == ["process_gone"]
