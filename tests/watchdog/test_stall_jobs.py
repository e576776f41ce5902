"""Real 3-rank Lightning jobs (gloo on CPU) with one faulty rank: every live rank dumps into one
event folder and the summary names the culprit. Outcomes only, never durations."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from support import contexts
from watchdog.harness import (
    PROGRAM_ERROR_EXIT_CODE,
    STALL_EXIT_CODE,
    assert_culprit,
    assert_every_rank_dumped,
    run_job,
    run_ranks_by_hand,
    start_job,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)
WORLD = 3


def _one_stall(result) -> Path:
    events = result.events()
    assert len(events) == 1, f"expected one event folder, got {events}\n{result.log[-4000:]}"
    assert events[0].name == "stall-001"
    return events[0]


@pytest.mark.parametrize(
    ("fault", "culprit", "kind", "exit_code"),
    [
        # rank 1 sleeps inside training_step, outside any collective
        ("stuck_train", 1, "stuck_outside_collective", STALL_EXIT_CODE),
        # rank 2 skips an all_reduce the others enter: the program's fault, exit_codes maps it to 76
        ("skip_collective", 2, "program_divergence", PROGRAM_ERROR_EXIT_CODE),
        # rank 1 calls all_gather where the others call all_reduce
        ("other_collective", 1, "argument_mismatch", PROGRAM_ERROR_EXIT_CODE),
        # rank 2 blocks in its data loader
        ("stuck_loader", 2, "stuck_outside_collective", STALL_EXIT_CODE),
    ],
)
def test_stalled_rank_is_dumped_and_named(tmp_path: Path, fault: str, culprit: int, kind: str, exit_code: int) -> None:
    result = run_job(tmp_path, "--fault", fault, "--fault-rank", str(culprit), "--strategy", "ddp_ncclx")
    assert result.returncode == exit_code, result.log[-4000:]
    folder = _one_stall(result)
    found = assert_every_rank_dumped(folder, WORLD, result.log)
    assert found[culprit]["phase"] in ("train_step", "first_step")
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["missing_ranks"] == []
    summary = assert_culprit(folder, culprit, result.log)
    assert summary["hang_kind"] == kind
    if fault == "stuck_loader":  # the main thread's stack says where it waits
        detail = summary["findings"][0]["culprit_states"][0]["detail"]
        assert detail.startswith("outside any collective, waiting for the data loader: "), detail


@pytest.mark.parametrize("devices", [1, WORLD])
def test_a_program_stuck_on_every_rank_is_named_where_it_stopped(tmp_path: Path, devices: int) -> None:
    """Every rank sleeps in training_step (a lock, a shared-filesystem read): no rank waits in a
    collective, and the watchdog's step threshold confirms the stall. Never "no hang"."""
    result = run_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "-1", "--devices", str(devices),
                     "--strategy", "ddp_ncclx", "--no-auto", "--train-step-seconds", "5")
    assert result.returncode == PROGRAM_ERROR_EXIT_CODE, result.log[-4000:]
    folder = _one_stall(result)
    assert_every_rank_dumped(folder, devices, result.log)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["hang_kind"] == "program_stalled", summary["hang_kind_reason"]
    assert "train_job.py" in summary["hang_kind_reason"] and "in training_step" in summary["hang_kind_reason"]
    assert summary["restart_advice"]["action"] == "do_not_restart"
    assert summary["culprit_ranks"] == []
    text = (folder / "summary.txt").read_text()
    assert text.startswith("KIND: program_stalled - ") and "NO HANG" not in text and "nothing is wrong" not in text


def test_hang_in_an_epoch_end_collective_is_caught(tmp_path: Path) -> None:
    result = run_job(tmp_path, "--fault", "stuck_epoch_end", "--fault-rank", "1", "--strategy", "ddp_ncclx")
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    folder = _one_stall(result)
    found = assert_every_rank_dumped(folder, WORLD, result.log)
    assert {ctx["phase"] for ctx in found.values()} == {"validation"}
    assert_culprit(folder, 1, result.log)


def test_stall_is_recorded_in_the_trainers_logger(tmp_path: Path) -> None:
    """Recorded by rank 0's watchdog thread while its main thread is stuck, before the exit."""
    result = run_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "2", "--strategy", "ddp_ncclx",
                     "--csv-logger")
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    metrics = list(tmp_path.rglob("metrics.csv"))
    assert len(metrics) == 1, f"expected rank 0's metrics.csv, found {metrics}"
    text = metrics[0].read_text()
    assert "ncclx/stall_events" in text.splitlines()[0]
    assert ",1.0" in text, text
    # rank 0 initiated and summarized: the hang kind is a metric too (rank 2 sleeps in its own code)
    assert "ncclx/hang_kind/stuck_outside_collective" in text.splitlines()[0], text


def test_stuck_rank_stack_shows_where_it_waits(tmp_path: Path) -> None:
    """Stock ``ddp`` + an explicit StallWatchdog callback (no ncclx strategy involved)."""
    result = run_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "2", "--strategy", "ddp")
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    folder = _one_stall(result)
    found = assert_every_rank_dumped(folder, WORLD, result.log)
    stacks = (folder / found[2]["stacks_file"]).read_text()
    assert "time.sleep(FOREVER)" in stacks and "ncclx-watchdog-rank2" in stacks
    assert_culprit(folder, 2, result.log)


def test_noticing_rank_other_than_rank_zero_initiates_and_summarizes(tmp_path: Path) -> None:
    result = run_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "1", "--noticer-rank", "2",
                     "--slow-rank-threshold", "8", "--strategy", "ddp")
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    folder = _one_stall(result)
    found = assert_every_rank_dumped(folder, WORLD, result.log)
    assert {ctx["initiator_rank"] for ctx in found.values()} == {2}
    assert found[2]["reason"] == "stall" and found[0]["reason"] == "peer_request"
    assert json.loads((folder / "collection.json").read_text())["initiator_rank"] == 2
    assert_culprit(folder, 1, result.log)


def test_raising_rank_dumps_itself_and_asks_the_others(tmp_path: Path) -> None:
    result = run_job(tmp_path, "--fault", "raise", "--fault-rank", "1", "--strategy", "ddp_ncclx")
    assert result.returncode not in (0, None), result.log[-4000:]
    events = result.events("exception-")
    assert [e.name for e in events] == ["exception-rank1-001"], f"{events}\n{result.log[-4000:]}"
    found = assert_every_rank_dumped(events[0], WORLD, result.log)
    assert found[1]["reason"] == "exception" and "injected failure" in found[1]["exception"]
    assert_culprit(events[0], 1, result.log)


def test_node_local_dump_folders_are_gathered_through_the_store(tmp_path: Path) -> None:
    result = run_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "0", "--noticer-rank", "1",
                     "--slow-rank-threshold", "40", "--node-local", "--strategy", "ddp")
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    summarizer_folder = result.dump_dir / "node1" / "stall-001"
    found = assert_every_rank_dumped(summarizer_folder, WORLD, result.log)
    gathered = {p.name for p in (summarizer_folder / "ranks").rglob("rank_*")}
    assert {"rank_00000.context.json", "rank_00002.context.json"} <= gathered
    assert not any(p.name.startswith("rank_00001") for p in (summarizer_folder / "ranks").rglob("*"))
    assert found[1]["initiator_rank"] == 1
    assert_culprit(summarizer_folder, 0, result.log)


def test_slow_but_healthy_run_raises_no_alarm(tmp_path: Path) -> None:
    """Slow first step, slow steps, a validation batch, a checkpoint and the second epoch's first
    batch (its loader starting) each longer than train_step_seconds, two epochs: no dump, and the
    job ends normally. Consensus detection is armed after 2 steps (wait 2.4 s) for all of it."""
    result = run_job(tmp_path, "--fault", "healthy_slow", "--batches", "4", "--epochs", "2",
                     "--strategy", "ddp_ncclx", "--consensus-warmup", "2", "--consensus-min-wait", "1.0")
    assert result.returncode == 0, result.log[-4000:]
    assert result.events() == [], result.log[-4000:]
    assert "stall:" not in result.log and "stall by consensus" not in result.log
    assert list((result.dump_dir / "ckpt").glob("*.ckpt")), "the checkpoint phase was not exercised"


def test_sigusr2_dumps_every_rank_and_training_continues(tmp_path: Path) -> None:
    result = run_job(tmp_path, "--fault", "signal", "--fault-rank", "0", "--batches", "12",
                     "--on-stall", "dump", "--strategy", "ddp", "--then-validate", "--report-store-keys")
    assert result.returncode == 0, result.log[-4000:]
    store_line = next(line for line in result.log.splitlines() if line.startswith("STORE_KEYS_LEFT "))
    assert json.loads(store_line.split(" ", 1)[1]) == {"left": [], "meta": True}, store_line
    events = result.events()
    assert [e.name for e in events] == ["ondemand-001"], f"{events}\n{result.log[-4000:]}"
    # trainer.validate after fit starts a new watchdog on the same store: the old event is not
    # taken for a new one (which would dump every rank again, over the first dump)
    assert result.log.count("ondemand-001 (on_demand") == WORLD, result.log[-4000:]
    found = assert_every_rank_dumped(events[0], WORLD, result.log)
    assert found[0]["reason"] == "on_demand"


def test_a_rank_that_dies_is_named_as_gone_without_waiting_for_its_dump(tmp_path: Path) -> None:
    """Rank 2 is SIGKILLed mid-step (as by the OOM killer); its peers' gloo collective fails and
    they dump. A rank of the same host finds rank 2's process gone, so the initiator summarizes
    at once (collect_timeout_seconds is 15 s here) and names rank 2 as ``process_gone``."""
    result = run_ranks_by_hand(tmp_path, WORLD, "--fault", "die", "--fault-rank", "2", "--strategy", "ddp_ncclx")
    assert result.returncode is not None, result.log[-6000:]
    events = result.events("exception-")
    assert len(events) == 1, f"{events}\n{result.log[-6000:]}"
    folder = events[0]
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["missing_ranks"] == [2] and collection["gone_ranks"] == [2], collection
    summary = assert_culprit(folder, 2, result.log)
    assert summary["verdict"] == "dump_missing"
    assert summary["op"] == "all_reduce"  # the sub-group collective the others were in, not an older one
    head = summary["findings"][0]
    assert head["confidence"] == "high"
    assert [c["state"] for c in head["culprit_states"]] == ["process_gone"]
    assert "no dump from rank(s) [2] within" not in result.log  # it was not waited for


def test_a_rank_alive_but_unable_to_dump_is_named_with_its_process_state(tmp_path: Path) -> None:
    """Rank 2 SIGSTOPs itself mid-step: its watchdog thread is stopped too, so it never dumps,
    yet its process is there. The initiator (same host) names it ``no_answer`` with state T."""
    result = run_job(tmp_path, "--fault", "freeze", "--fault-rank", "2", "--strategy", "ddp_ncclx")
    # rank 0 waits up to 5 s for the stopped rank to leave; Lightning may SIGKILL it first
    assert result.returncode in (STALL_EXIT_CODE, -9), result.log[-6000:]
    folder = _one_stall(result)
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["missing_ranks"] == [2] and collection["gone_ranks"] == [], collection
    assert collection["silent_ranks"]["2"]["state"] == "T", collection
    summary = assert_culprit(folder, 2, result.log)
    assert summary["verdict"] == "dump_missing"
    state = summary["findings"][0]["culprit_states"][0]
    assert state["state"] == "no_answer" and "stopped" in state["detail"], state


def test_sigusr2_while_every_rank_is_blocked_dumps_every_rank(tmp_path: Path) -> None:
    """Rank 1 sleeps in training_step; ranks 0 and 2 wait in a gloo all_reduce (no stall alarm:
    60 s threshold). ``kill -USR2`` to rank 0, whose main thread is inside the collective: every
    rank dumps, long before the collective could time out (120 s)."""
    marker = tmp_path / "blocked"
    job = start_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "1", "--strategy", "ddp_ncclx",
                    "--on-stall", "dump", "--no-auto", "--train-step-seconds", "60", "--marker", str(marker))
    try:
        assert wait_for(lambda: marker.exists(), 90), job.log()[-4000:]
        time.sleep(1.0)  # ranks 0 and 2 are in the all_reduce by now
        os.kill(job.proc.pid, signal.SIGUSR2)  # rank 0 runs in the launching process
        folder = job.dump_dir / "ondemand-001"
        assert wait_for(lambda: len(contexts(folder)) == WORLD, 60), job.log()[-4000:]
        assert wait_for(lambda: (folder / "summary.json").is_file(), 60), job.log()[-4000:]
    finally:
        job.stop()
    found = assert_every_rank_dumped(folder, WORLD)
    assert found[0]["reason"] == "on_demand"
    assert "stall:" not in job.log()


def test_a_stall_after_an_on_demand_dump_is_still_caught(tmp_path: Path) -> None:
    """Rank 1 asks for an on-demand dump, then stays stuck in the same step: the on-demand event
    does not switch off the stall clock of that step."""
    result = run_job(tmp_path, "--fault", "signal_then_stuck", "--fault-rank", "1", "--strategy", "ddp_ncclx")
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    assert [e.name for e in result.events()] == ["ondemand-001", "stall-002"], result.log[-4000:]
    assert_culprit(result.events()[1], 1, result.log)


@pytest.mark.parametrize(("strategy", "weights_only"), [("ddp_ncclx", True), ("ddp_ncclx", False), ("fsdp_ncclx", True)])
def test_slow_checkpoint_building_is_not_a_stall(tmp_path: Path, strategy: str, weights_only: bool) -> None:
    """ModelCheckpoint(every_n_train_steps=3) on a model whose state_dict() takes 4.5 s (the
    learned step threshold is 2 s): Lightning builds the checkpoint before any hook runs, and
    with save_weights_only no on_save_checkpoint is called at all. No event, normal exit."""
    args = ["--fault", "slow_state_dict", "--batches", "7", "--strategy", strategy]
    result = run_job(tmp_path, *args, *(["--save-weights-only"] if weights_only else []))
    assert result.returncode == 0, result.log[-4000:]
    assert result.events() == [], result.log[-4000:]
    assert "stall:" not in result.log
    assert len(list((result.dump_dir / "ckpt").glob("*.ckpt"))) == 2, "both checkpoints were written"


def test_a_rank_holding_the_gil_is_named_with_its_native_stack(tmp_path: Path) -> None:
    """Rank 2's main thread holds the GIL in native code (a regex), so its watchdog thread never
    runs and it never dumps; faulthandler's own thread writes its stacks after the threshold,
    and the summarizing rank on the same host reports where its main thread is."""
    result = run_job(tmp_path, "--fault", "hold_gil", "--fault-rank", "2", "--strategy", "ddp_ncclx")
    assert result.returncode == STALL_EXIT_CODE, result.log[-6000:]
    folder = _one_stall(result)
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["missing_ranks"] == [2], collection
    silent = collection["silent_ranks"]["2"]
    assert silent["state"] == "R", silent
    assert silent["main_thread"].endswith("in training_step"), silent
    assert (folder / silent["native_stacks"]).is_file()
    summary = assert_culprit(folder, 2, result.log)
    assert summary["verdict"] == "dump_missing"


def test_a_hang_at_exit_is_dumped_and_ended(tmp_path: Path) -> None:
    """A healthy fit whose processes then hang at exit (as destroy_process_group can): after
    teardown_seconds (validation_seconds, 10 s here) each rank writes its stacks and exits 75."""
    result = run_job(tmp_path, "--fault", "hang_at_exit", "--strategy", "ddp_ncclx")
    assert result.returncode == STALL_EXIT_CODE, result.log[-4000:]
    assert result.events() == [] and "stall:" not in result.log, result.log[-4000:]
    stacks = (result.dump_dir / "teardown-rank0.stacks.txt").read_text()
    assert "ncclx-exit-guard" in stacks
