"""Real 3-rank Lightning jobs (gloo on CPU) whose rank 2 calls the step's all_reduce with another
dtype from the same line: doubles (its peer with the smaller buffer, rank 1, is aborted by gloo
and rank 2 raises "Connection reset by peer") or halves (rank 2 itself is aborted). Neither is a
lost node to restart: the rank that is gone ended with SIGABRT (collection.json says so, seen on
the same host), so both are argument mismatches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from watchdog.harness import run_ranks_by_hand

pytestmark = pytest.mark.timeout(240)
JOB = ("--strategy", "ddp_ncclx", "--step-sleep", "0.25", "--batches", "14", "--at-batch", "8",
       "--consensus-warmup", "4", "--consensus-min-wait", "1.0", "--train-step-seconds", "20", "--no-auto")


@pytest.mark.parametrize("fault", ["dtype_mismatch", "half_dtype_mismatch"])
def test_a_dtype_mismatch_that_gloo_turns_into_an_abort_is_not_restarted(tmp_path: Path, fault: str) -> None:
    # ranks started by hand (as under srun): Lightning's launcher would SIGKILL every rank once one aborts
    result = run_ranks_by_hand(tmp_path, 3, *JOB, "--fault", fault, "--fault-rank", "2")
    summaries = [e / "summary.json" for e in result.events() if (e / "summary.json").is_file()]
    assert len(summaries) == 1, (result.events(), result.log[-4000:])
    summary = json.loads(summaries[0].read_text())
    assert summary["culprit_ranks"] == [2], summary["headline"]
    assert summary["hang_kind"] == "argument_mismatch", summary["hang_kind_reason"]
    assert summary["restart_advice"]["action"] == "do_not_restart", (summary["restart_advice"], summary["per_rank"],
                                                                    summary["context"].get("exceptions"))
    gone = [r["rank"] for r in summary["per_rank"] if r["state"] == "process_gone"]
    if gone:  # gloo aborted a rank before it dumped: how it ended is recorded where the others collected
        assert any("EnforceNotMet ... op.preamble.length <= op.nbytes" in a for a in summary["advice"]), summary["advice"]
        collection = json.loads((summaries[0].parent / "collection.json").read_text())
        for rank in gone:
            exit_ = collection["gone_exits"][str(rank)]
            assert (exit_["signal"], exit_["status"]) == ("SIGABRT", 134), exit_
            assert exit_["known_from"], exit_
            assert summary["context"]["rank_exits"][str(rank)]["signal"] == "SIGABRT"
    if fault == "dtype_mismatch" or not gone:
        assert summary["verdict"] == "dtype_mismatch"
