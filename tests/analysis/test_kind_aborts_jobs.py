"""Real 3-rank Lightning jobs (gloo on CPU) whose rank 2 calls the step's all_reduce with another
dtype from the same line: doubles (its peer with the smaller buffer, rank 1, is aborted by gloo
and rank 2 raises "Connection reset by peer") or halves (rank 2 itself is aborted). Neither is a
lost node to restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from watchdog.harness import run_ranks_by_hand

pytestmark = pytest.mark.timeout(240)
JOB = ("--strategy", "ddp_ncclx", "--step-sleep", "0.25", "--batches", "14", "--at-batch", "8",
       "--consensus-warmup", "4", "--consensus-min-wait", "1.0", "--train-step-seconds", "20", "--no-auto")


@pytest.mark.parametrize(("fault", "kind"), [("dtype_mismatch", "argument_mismatch"),
                                             ("half_dtype_mismatch", "rank_lost")])
def test_a_dtype_mismatch_that_gloo_turns_into_an_abort_is_not_restarted(tmp_path: Path, fault: str, kind: str) -> None:
    # ranks started by hand (as under srun): Lightning's launcher would SIGKILL every rank once one aborts
    result = run_ranks_by_hand(tmp_path, 3, *JOB, "--fault", fault, "--fault-rank", "2")
    summaries = [e / "summary.json" for e in result.events() if (e / "summary.json").is_file()]
    assert len(summaries) == 1, (result.events(), result.log[-4000:])
    summary = json.loads(summaries[0].read_text())
    assert summary["culprit_ranks"] == [2], summary["headline"]
    assert summary["hang_kind"] == kind, summary["hang_kind_reason"]
    assert summary["restart_advice"]["action"] == "do_not_restart", (summary["restart_advice"], summary["per_rank"],
                                                                    summary["context"].get("exceptions"))
    if any(r["state"] == "process_gone" for r in summary["per_rank"]):  # gloo aborted a rank before it dumped
        assert any("EnforceNotMet ... op.preamble.length <= op.nbytes" in a for a in summary["advice"]), summary["advice"]
    if kind == "argument_mismatch":
        assert summary["verdict"] == "dtype_mismatch"
