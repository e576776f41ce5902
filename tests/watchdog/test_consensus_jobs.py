"""Consensus detection in real 3-rank Lightning jobs (gloo on CPU, steps of 0.25 s).

The step threshold is fixed at 20 s (no learned threshold): consensus starts an event within a
few seconds of the fault, long before it, and which detector started it is read from the
initiator's context.json. With ``dump_and_exit`` the hang is confirmed (and the job ended) once
that threshold has passed. Outcomes only, never durations."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import contexts
from watchdog.harness import (
    PROGRAM_ERROR_EXIT_CODE, REPO, STALL_EXIT_CODE, assert_culprit, assert_every_rank_dumped, free_port, run_job,
    start_job, wait_for,
)

pytestmark = pytest.mark.timeout(240)
WORLD = 3
CONSENSUS_JOB = ("--strategy", "ddp_ncclx", "--step-sleep", "0.25", "--batches", "14", "--at-batch", "8",
                 "--consensus-warmup", "4", "--consensus-min-wait", "1.0", "--train-step-seconds", "20", "--no-auto")


def _detection(folder: Path) -> dict:
    found = contexts(folder)
    initiators = [ctx for ctx in found.values() if ctx["reason"] == "stall"]
    assert len(initiators) == 1, [ctx["reason"] for ctx in found.values()]
    return initiators[0].get("detection") or {}


@pytest.mark.parametrize(
    ("fault", "culprit", "kind", "exit_code", "extra"),
    [
        ("stuck_train", 1, "stuck_outside_collective", STALL_EXIT_CODE, ()),
        ("stuck_loader", 2, "stuck_outside_collective", STALL_EXIT_CODE, ()),
        ("skip_collective", 2, "program_divergence", PROGRAM_ERROR_EXIT_CODE, ()),
        ("other_collective", 1, "argument_mismatch", PROGRAM_ERROR_EXIT_CODE, ()),
        # the others wait in FSDP's own all-gathers (FSDP2's run under torch._dynamo.disable)
        ("stuck_train", 1, "stuck_outside_collective", STALL_EXIT_CODE,
         ("--strategy", "fsdp2_ncclx", "--no-step-collective")),
        ("stuck_train", 1, "stuck_outside_collective", STALL_EXIT_CODE,
         ("--strategy", "fsdp_ncclx", "--no-step-collective")),
        # a send/recv pipeline: rank 1 never sends; rank 2 waits in recv from it, rank 0 in a collective
        ("stuck_pipeline", 1, "stuck_outside_collective", STALL_EXIT_CODE, ()),
    ],
    ids=["stuck_train", "stuck_loader", "skip_collective", "other_collective", "fsdp2_stuck_train",
         "fsdp_stuck_train", "stuck_pipeline"],
)
def test_consensus_starts_the_event_and_the_summary_names_the_culprit(
        tmp_path: Path, fault: str, culprit: int, kind: str, exit_code: int, extra: tuple[str, ...]) -> None:
    result = run_job(tmp_path, *CONSENSUS_JOB, "--fault", fault, "--fault-rank", str(culprit), *extra)
    assert result.returncode == exit_code, result.log[-4000:]
    events = result.events()
    assert [e.name for e in events] == ["stall-001"], result.log[-4000:]
    assert_every_rank_dumped(events[0], WORLD, result.log)
    detection = _detection(events[0])
    assert detection.get("by") == "consensus", (detection, result.log[-4000:])
    assert "stall by consensus of every rank" in result.log
    summary = assert_culprit(events[0], culprit, result.log)
    assert summary["hang_kind"] == kind
    if fault.startswith("stuck_"):  # the culprit was busy elsewhere while the others waited for it
        assert detection["busy_ranks"] == [culprit]
        assert sorted(detection["blocked_ranks"]) == sorted(set(range(WORLD)) - {culprit})
    if fault == "stuck_pipeline":
        # rank 2's recv from rank 1, and nothing else: rank 0 waits in the step's next all_reduce, so
        # the last one is over on rank 2 however late its recorder marks it completed
        assert re.search(r"rank\(s\) 2 blocked in recv from rank 1 \(gloo group \d+\)(;|$)", detection["picture"]), detection
        assert summary["findings"][0]["waiting_ranks"] == [2] and summary["op"] == "recv"  # what rank 2 is in


@pytest.mark.parametrize("fault", ["hold_gil", "freeze"])
def test_a_rank_whose_watchdog_cannot_run_is_found_by_consensus(tmp_path: Path, fault: str) -> None:
    """Rank 2's main thread holds the GIL in a regex (``hold_gil``) or its process is stopped
    (``freeze``): its watchdog posts nothing and answers no ping. The others' notices and its
    silence start the event by consensus, long before the 20 s step threshold, and the summary
    names rank 2 without waiting the collection timeout for its dump."""
    result = run_job(tmp_path, *CONSENSUS_JOB, "--fault", fault, "--fault-rank", "2")
    assert result.returncode in (STALL_EXIT_CODE, -9), result.log[-4000:]  # Lightning may SIGKILL a stopped rank
    events = result.events()
    assert [e.name for e in events] == ["stall-001"], result.log[-4000:]
    detection = _detection(events[0])
    assert detection.get("by") == "consensus", (detection, result.log[-4000:])
    assert detection["silent_ranks"] == [2] and sorted(detection["blocked_ranks"]) == [0, 1], detection
    collection = json.loads((events[0] / "collection.json").read_text())
    assert collection["missing_ranks"] == [2], collection
    assert "no dump from rank(s) [2] within" in result.log  # given up on after the grace, not the timeout
    summary = assert_culprit(events[0], 2, result.log)
    assert summary["culprit_ranks"] == [2] and summary["verdict"] == "dump_missing", summary["culprit_ranks"]


def test_when_rank_0_holds_the_gil_rank_1_starts_the_event(tmp_path: Path) -> None:
    """Rank 0's main thread holds the GIL (its process also hosts the store, whose server threads
    need no GIL): rank 1, the deputy, finds it silent and starts the event; the summary names it."""
    job = start_job(tmp_path, *CONSENSUS_JOB, "--fault", "hold_gil", "--fault-rank", "0", "--on-stall", "dump")
    folder = job.dump_dir / "stall-001"
    try:
        # the reports after summary.json come from a thread of their own: all three before the job is stopped
        assert wait_for(lambda: all((folder / f"summary.{ext}").is_file() for ext in ("json", "txt", "html")),
                        150), job.log()[-4000:]
    finally:
        job.stop()
    detection = _detection(folder)
    assert detection.get("by") == "consensus" and detection["silent_ranks"] == [0], (detection, job.log()[-4000:])
    assert contexts(folder)[1]["reason"] == "stall"  # rank 1 started it
    summary = assert_culprit(folder, 0, job.log())
    assert summary["culprit_ranks"] == [0]


@pytest.mark.parametrize(
    ("fault", "fault_rank"),
    [
        ("slow_rank", 1),               # rank 1's steps take 1.5x and every loader a random 0-0.25 s: the
                                        # others wait for someone every step
        ("slow_val_sync", 1),           # rank 1 spends 3 s in a validation batch; the others wait in its all_reduce
        ("slow_checkpoint_rank0", 0),   # rank 0 builds a checkpoint for 4 s; the others wait in its barrier
        ("busy_rank0_hook", 0),         # rank 0 computes for 4 s in a batch-end hook; the others wait in a barrier
    ],
)
def test_healthy_jobs_raise_no_event(tmp_path: Path, fault: str, fault_rank: int) -> None:
    result = run_job(tmp_path, *CONSENSUS_JOB, "--fault", fault, "--fault-rank", str(fault_rank))
    assert result.returncode == 0, result.log[-4000:]
    assert result.events() == [], result.log[-4000:]
    assert "stall by consensus" not in result.log


SLOW_HOOKS_JOB = ("--strategy", "ddp_ncclx", "--fault", "slow_epoch_end_hooks", "--hook-seconds", "5",
                  "--validation-seconds", "20", "--step-sleep", "1.0", "--batches", "8", "--epochs", "2")


# both detectors in one job, each tuned to fire on such waits if it took them for training:
# consensus (warm after 4 steps, its wait ~3 s at these 1 s steps) and a 3 s step threshold
# (learning on); the hooks are in validation, whose threshold is 20 s
DETECTORS = ("--consensus-warmup", "4", "--consensus-min-wait", "1.0", "--train-step-seconds", "3")


@pytest.mark.timeout(360)
def test_slow_epoch_end_and_validation_end_hooks_run_in_validation_and_raise_no_event(tmp_path: Path) -> None:
    """At every epoch end one rank spends 5 s in a hook while the others wait for it in a barrier:
    a user callback listed before the watchdog (on_train_epoch_end, sleeping), the module's
    on_train_epoch_end (computing), a user Checkpoint callback that Lightning moves last
    (on_validation_end, sleeping) and the module's on_validation_end (sleeping). Neither
    consensus nor the step threshold starts an event."""
    # about 100 s of hooks, steps and validation by design: the default 120 s limit was too tight on a loaded machine
    result = run_job(tmp_path, *SLOW_HOOKS_JOB, *DETECTORS, "--on-stall", "dump", timeout=300.0)
    assert result.returncode == 0, result.log[-4000:]
    assert result.events() == [], result.log[-4000:]
    assert "stall:" not in result.log and "stall by consensus" not in result.log, result.log[-4000:]


def test_the_probe_sees_the_collective_a_rank_waits_in(tmp_path: Path) -> None:
    """A real gloo wait, probed from another thread of the waiting rank."""
    job = Path(__file__).parent / "jobs" / "probe_job.py"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    port, release = str(free_port()), str(tmp_path / "release")
    procs = [subprocess.Popen([sys.executable, str(job), str(r), port, release], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for r in range(2)]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    line = next(line for line in outputs[0].splitlines() if line.startswith("PROBE "))
    found = json.loads(line[len("PROBE "):])
    assert found["idle"] == [] and found["after"] == []
    assert found["blocked"] == [["gloo", "1", 6]]  # the sub-group's 6th op: five completed before it



@pytest.mark.timeout(500)
def test_a_wait_that_ends_is_marked_recovered_never_ends_the_job_and_is_learnt(tmp_path: Path) -> None:
    """Every default, ``dump_and_exit``, 1 s steps: rank 0 waits 12 s in a user callback's
    ``on_train_batch_end`` (a synchronous upload) twice, 22 s apart (the training ends before a third). The first wait is reported
    early (evidence) and then marked recovered; the job is not ended (the hang was never
    confirmed); the second wait at the same site raises no event (the wait there was learnt)."""
    result = run_job(tmp_path, "--strategy", "ddp_ncclx", "--fault", "soak_waits", "--fault-rank", "1",
                     "--at-batch", "0", "--step-sleep", "1.0", "--step-noise", "0.1", "--watchdog-defaults",
                     "--on-stall", "dump_and_exit", "--max-minutes", "1.05", "--epoch-size", "400",
                     "--wait-every", "22", "--loader-stall-every", "100000", "--hook-seconds", "0", timeout=400)
    assert result.returncode == 0, result.log[-4000:]
    assert result.log.count("soak: hook wait of 12 s") == 2, result.log[-4000:]
    events = result.events()
    assert [e.name for e in events] == ["stall-001"], result.log[-4000:]
    recovery = json.loads((events[0] / "collection.json").read_text())["recovery"]
    assert recovery["recovered"] is True and recovery["lasted_seconds"] >= 10.0, recovery  # a 12 s sleep
    assert "stall-001 recovered after" in result.log and "not a hang" in result.log
    summary = json.loads((events[0] / "summary.json").read_text())
    assert summary["recovery"]["lasted_seconds"] == recovery["lasted_seconds"], summary["recovery"]
    assert (events[0] / "summary.txt").read_text().startswith("RECOVERED: recovered after")
    assert "exiting with code" not in result.log
