"""A skipped collective named by program order in a real 3-rank Lightning FSDP2 job (gloo on CPU):
rank 1 skips the step's all_reduce on the default group and goes on into FSDP2's all-gather on
the same group, which gloo pairs with the others' all_reduce. The calls differ in op and size,
yet the rank took another path: its own earlier steps call that all-gather right after the
all_reduce it skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.harness import PROGRAM_ERROR_EXIT_CODE, assert_culprit, run_job

pytestmark = pytest.mark.timeout(240)


def test_a_rank_that_skips_the_steps_all_reduce_in_an_fsdp2_job_is_named_for_the_skip(tmp_path: Path) -> None:
    result = run_job(tmp_path, "--strategy", "fsdp2_ncclx", "--fault", "skip_world_collective", "--fault-rank", "1",
                     "--step-sleep", "0.25", "--batches", "14", "--at-batch", "8", "--consensus-warmup", "4",
                     "--consensus-min-wait", "1.0", "--train-step-seconds", "20", "--no-auto")
    assert result.returncode == PROGRAM_ERROR_EXIT_CODE, result.log[-4000:]
    events = result.events()
    assert [e.name for e in events] == ["stall-001"], result.log[-4000:]
    summary = assert_culprit(events[0], 1, result.log)
    assert summary["culprit_ranks"] == [1] and summary["waiting_ranks"] == [0, 2], summary["headline"]
    assert summary["hang_kind"] == "program_divergence", summary["hang_kind_reason"]
    assert summary["verdict"] == "not_entered" and summary["op"] == "all_reduce"
    assert summary["headline"].startswith("not_entered: rank(s) 1 skipped all_reduce[3]/Float"), summary["headline"]
    assert any(e.startswith("program order: rank(s) 1 called all_gather") for e in summary["findings"][0]["evidence"])
