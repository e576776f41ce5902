"""The hang kind of real jobs: small gloo jobs (healthy, skipped collective, size mismatch) and
real 3-rank Lightning jobs under the watchdog (a rank stuck in its data loader, a killed rank).
The exit status the watchdog would use differs between a program divergence and a lost rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.config import WatchdogConfig, exit_code_for

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(("scenario", "kind", "restart"), [
    ("healthy", "no_hang", "restart"),
    ("skip", "program_divergence", "do_not_restart"),
    ("size", "argument_mismatch", "do_not_restart"),
    ("outside", "stuck_outside_collective", "restart"),
])
def test_gloo_jobs_get_their_kind(gloo_dumps, scenario, kind, restart):
    d = analyze_folder(gloo_dumps[scenario] / "ours").to_dict()
    assert (d["hang_kind"], d["restart_advice"]["action"]) == (kind, restart), d["hang_kind_reason"]
    assert d["hang_kind_reason"]


def test_skipped_collective_advice_names_the_culprits_call_site_and_the_others(gloo_dumps):
    d = analyze_folder(gloo_dumps["skip"] / "ours").to_dict()
    assert f"gloo_worker.py:{_line('        time.sleep(0.1)')} in wait_outside_collectives" in d["advice"][0]  # rank 2
    assert f"gloo_worker.py:{_line('    dist.all_reduce(t, group=group)')} in step_a" in d["advice"][1]  # the others


def _line(text: str) -> int:
    """The line of gloo_worker.py that is ``text`` (the first one)."""
    worker = Path(__file__).with_name("gloo_worker.py").read_text().splitlines()
    return worker.index(text) + 1


def test_size_mismatch_advice_names_both_call_sites(gloo_dumps):
    d = analyze_folder(gloo_dumps["size"] / "ours").to_dict()
    assert any("rank(s) 0, 1 called it at" in a and "in step_a" in a for a in d["advice"]), d["advice"]
    # the same call site (none differ in the recorder), and where rank 2 is now
    assert any(a.startswith("rank(s) 2 called it at the same call site, ") and "in step_a (it is now at " in a
               for a in d["advice"]), d["advice"]


def test_stuck_loader_and_killed_rank_from_real_watchdog_jobs(tmp_path: Path) -> None:
    from watchdog.harness import run_job, run_ranks_by_hand

    for sub in ("loader", "die"):
        (tmp_path / sub).mkdir()
    loader = run_job(tmp_path / "loader", "--fault", "stuck_loader", "--fault-rank", "2", "--strategy", "ddp_ncclx")
    events = loader.events("stall-")
    assert len(events) == 1, loader.log[-4000:]
    stuck = json.loads((events[0] / "summary.json").read_text())
    assert stuck["hang_kind"] == "stuck_outside_collective", stuck["hang_kind_reason"]
    assert "data loader" in stuck["hang_kind_reason"] and any("DataLoader a timeout" in a for a in stuck["advice"])
    assert (events[0] / "summary.txt").read_text().startswith("KIND: stuck_outside_collective - ")

    killed = run_ranks_by_hand(tmp_path / "die", 3, "--fault", "die", "--fault-rank", "2", "--strategy", "ddp_ncclx")
    events = killed.events("exception-")
    assert len(events) == 1, killed.log[-4000:]
    lost = json.loads((events[0] / "summary.json").read_text())
    assert lost["hang_kind"] == "rank_lost" and lost["culprit_ranks"] == [2], lost["hang_kind_reason"]
    assert any("dmesg" in a for a in lost["advice"])
    collection = json.loads((events[0] / "collection.json").read_text())
    assert collection["hang_kind"] == "rank_lost"
    assert "KIND: rank_lost" in killed.log  # the log summary leads with it

    config = WatchdogConfig()
    assert exit_code_for(lost["hang_kind"], config) == 75
    assert exit_code_for("program_divergence", config) == 76
    custom = WatchdogConfig(exit_codes={"rank_lost": 90, "program_divergence": 91})
    assert (exit_code_for(lost["hang_kind"], custom), exit_code_for("program_divergence", custom)) == (90, 91)


def test_a_skipped_collective_without_a_majority_is_named_by_program_order_in_a_real_job(tmp_path: Path) -> None:
    """3 ranks; rank 2 skips the all_reduce of training_step at batch 3 and goes on into backward's
    gradient all_reduce on the same group. gloo pairs the two: the rank receiving the bigger message
    aborts without a dump, another raises. No majority is left at that sequence id; rank 2's call
    breaks the order of its own earlier steps (training_step's all_reduce, then backward's), rank 0's
    does not."""
    from watchdog.harness import run_job

    result = run_job(tmp_path, "--fault", "skip_world_collective", "--fault-rank", "2", "--at-batch", "3",
                     "--strategy", "ddp_ncclx")
    events = result.events()
    assert len(events) == 1, result.log[-4000:]
    summary = json.loads((events[0] / "summary.json").read_text())
    assert len(summary["ranks_missing"]) == 1 and 2 not in summary["ranks_missing"], summary["ranks_missing"]
    head = summary["findings"][0]
    assert summary["culprit_ranks"] == [2], head["message"]
    assert head["confidence"] == "medium" and "broke the pattern of its own earlier steps" in head["message"]
    assert summary["hang_kind"] == "program_divergence", summary["hang_kind_reason"]
