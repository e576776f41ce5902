"""Chains of point-to-point waits in real 3-rank Lightning jobs (gloo on CPU, consensus detection):
a send/recv pipeline 0 -> 1 -> 2 runs every step before the step's all_reduce; rank 1 sends to
the wrong peer, or skips one send. The summary names rank 1 alone; ranks 0 and 2 wait on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.harness import PROGRAM_ERROR_EXIT_CODE, assert_culprit, assert_every_rank_dumped, run_job

pytestmark = pytest.mark.timeout(240)
JOB = ("--strategy", "ddp_ncclx", "--step-sleep", "0.25", "--batches", "14", "--at-batch", "8",
       "--consensus-warmup", "4", "--consensus-min-wait", "1.0", "--train-step-seconds", "20", "--no-auto")


@pytest.mark.parametrize("fault", ["pipeline_wrong_peer", "pipeline_skip_send"])
def test_the_rank_that_broke_the_pipeline_is_the_culprit_and_the_others_wait_on_it(tmp_path: Path, fault: str) -> None:
    result = run_job(tmp_path, *JOB, "--fault", fault, "--fault-rank", "1")
    assert result.returncode == PROGRAM_ERROR_EXIT_CODE, result.log[-4000:]
    events = result.events()
    assert [e.name for e in events] == ["stall-001"], result.log[-4000:]
    assert_every_rank_dumped(events[0], 3, result.log)
    summary = assert_culprit(events[0], 1, result.log)
    assert summary["culprit_ranks"] == [1] and summary["hang_kind"] == "program_divergence", summary["headline"]
    assert summary["restart_advice"]["action"] == "do_not_restart"
    head = summary["findings"][0]
    waits = {w["rank"]: w for w in head["waits"]}
    assert sorted(waits) == [0, 2], head
    assert waits[2]["on"] == [1] and waits[2]["in"].startswith("recv from rank 1")
    assert waits[0]["in"].startswith("all_reduce")
    for lower in summary["findings"][1:]:  # a finding that names a waiting rank says whom it waits on
        if set(lower["ranks"]) & {0, 2}:
            assert lower["evidence"][0].startswith("consequence: rank"), lower
    text = (events[0] / "summary.txt").read_text()
    assert "HANG: not_entered - culprit rank(s) 1\n" in text
    assert "  rank 2 waits on rank(s) 1: in recv from rank 1" in text
