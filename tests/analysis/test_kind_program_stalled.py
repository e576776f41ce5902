"""The kind of a confirmed stall in which no rank is missing from a collective, built on the real
NCCL dump of an H200 (torch 2.11, legacy ProcessGroupNCCL): whether the stall is the program's
or the collective's is decided from torch's own ``pg_status``, the ranks' stacks and the event,
never from an entry's ``scheduled`` state alone (with NCCL timing off an entry that finished on
the GPU can still read ``scheduled``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.cli import main

H200_TIMEOUT_DUMP = Path(__file__).resolve().parents[1] / "data" / "nccl-h200" / "watchdog_timeout_rank_0.pkl"

SLEEPING_IN_TRAINING_STEP = """# Python stacks, pid 4242
--- thread 'MainThread' (id 1) ---
  File "/job/train.py", line 40, in <module>
    trainer.fit(model)
  File "/venv/lib/python3.11/site-packages/lightning/pytorch/loops/fit_loop.py", line 217, in run
    self.advance()
  File "/job/train.py", line 18, in training_step
    time.sleep(3600)
"""

WAITING_FOR_THE_GPU = """# Python stacks, pid 4242
--- thread 'MainThread' (id 1) ---
  File "/job/train.py", line 40, in <module>
    trainer.fit(model)
  File "/job/train.py", line 21, in training_step
    torch.cuda.synchronize()
  File "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", line 1040, in synchronize
    return torch._C._cuda_synchronize()
"""


def _h200_dump(pg_status: str) -> dict:
    """The real timeout dump (21 all_reduces, the last one ``scheduled`` and not retired), with
    torch's ``pg_status`` as it read (20 of 21 complete), as it reads once the GPU finished the
    last op before torch's watchdog retired it (``complete``), or as a backend without one."""
    dump = safe_loads(H200_TIMEOUT_DUMP.read_bytes())
    if pg_status == "complete":
        dump["pg_status"]["0"]["last_completed_collective"] = dump["pg_status"]["0"]["last_enqueued_collective"]
    elif pg_status == "absent":
        del dump["pg_status"]
    else:
        assert pg_status == "as_dumped"
    return dump


def _stall_folder(root: Path, dump: dict, stacks: str | None, event: str = "stall-001",
                  heartbeat_age: float = 30.0) -> Path:
    folder = root / event
    folder.mkdir(parents=True)
    (folder / "rank_00000.nccl.fr.pkl").write_bytes(pickle.dumps(dump))
    last_enqueued = dump["entries"][-1]["time_created_ns"] / 1e9
    context = {"schema": "lightning-ncclx/context/1", "event": event, "reason": "stall", "initiator_rank": 0,
               "rank": 0, "world_size": 1, "host": "gpu-01", "phase": "train_step", "step": 21,
               "seconds_since_heartbeat": heartbeat_age, "stall_threshold_seconds": 30.0, "time_unix": last_enqueued + 31.0,
               "trace_files": ["rank_00000.nccl.fr.pkl"]}
    if stacks is not None:
        context["stacks_file"] = "rank_00000.stacks.txt"
        (folder / "rank_00000.stacks.txt").write_text(stacks)
    (folder / "rank_00000.context.json").write_text(json.dumps(context))
    return folder


def _kind(folder: Path) -> tuple[str, str, str, tuple[str, ...]]:
    summary = analyze_folder(folder)
    c = summary.classification
    return c.kind.value, c.restart.value, c.reason, c.advice


def test_the_collective_torch_counts_unfinished_stays_a_stalled_collective(tmp_path: Path) -> None:
    """The real timeout: torch's watchdog counted 20 of 21 complete; the main thread's place does
    not overrule that (on NCCL it runs ahead of the GPU)."""
    folder = _stall_folder(tmp_path, _h200_dump("as_dumped"), SLEEPING_IN_TRAINING_STEP)
    kind, restart, reason, _ = _kind(folder)
    assert kind == "collective_stalled", reason
    assert "never completed" in reason


def test_a_finished_collective_that_reads_scheduled_is_not_blamed_for_a_program_stall(tmp_path: Path) -> None:
    folder = _stall_folder(tmp_path, _h200_dump("complete"), SLEEPING_IN_TRAINING_STEP)
    kind, restart, reason, advice = _kind(folder)
    assert kind == "program_stalled", reason
    assert "/job/train.py:18 in training_step" in reason
    assert restart == "do_not_restart"
    assert any("reads `scheduled`" in a and "torch's own watchdog" in a for a in advice), advice


def test_without_a_word_from_torch_the_stack_decides_and_the_doubt_is_said(tmp_path: Path) -> None:
    folder = _stall_folder(tmp_path, _h200_dump("absent"), SLEEPING_IN_TRAINING_STEP)
    kind, restart, reason, advice = _kind(folder)
    assert kind == "program_stalled", reason
    assert "/job/train.py:18 in training_step" in reason
    assert any("cannot tell a collective that finished on the GPU" in a for a in advice), advice


def test_a_main_thread_waiting_for_the_gpu_points_below_the_program(tmp_path: Path) -> None:
    folder = _stall_folder(tmp_path, _h200_dump("absent"), WAITING_FOR_THE_GPU)
    kind, restart, reason, _ = _kind(folder)
    assert kind == "collective_stalled", reason
    assert "cannot tell a collective that finished on the GPU" in reason


def test_no_stack_and_no_word_from_torch_keeps_the_collective_with_its_doubt(tmp_path: Path) -> None:
    folder = _stall_folder(tmp_path, _h200_dump("absent"), None)
    kind, _, reason, _ = _kind(folder)
    assert kind == "collective_stalled", reason
    assert "cannot tell a collective that finished on the GPU" in reason


def test_the_same_program_stall_gets_the_same_kind_whether_or_not_torch_retired_its_last_op(tmp_path: Path) -> None:
    """The GPU check's two runs of one fault: the last all_reduce retired (every entry complete),
    or finished and not yet retired (reads ``scheduled``, torch counts it complete)."""
    retired = _h200_dump("complete")
    last = retired["entries"][-1]
    last.update(state="completed", retired=True, time_discovered_completed_ns=last["time_created_ns"] + 1000)
    verdicts = set()
    for name, dump in (("retired", retired), ("unretired", _h200_dump("complete"))):
        summary = analyze_folder(_stall_folder(tmp_path / name, dump, SLEEPING_IN_TRAINING_STEP))
        verdicts.add((summary.classification.kind.value, summary.classification.restart.value,
                      summary.culprit_ranks))
    assert verdicts == {("program_stalled", "do_not_restart", ())}


@pytest.mark.parametrize("event", ["ondemand-001", "exception-001"])
def test_only_a_stall_the_watchdog_confirmed_is_called_a_program_stall(tmp_path: Path, event: str) -> None:
    retired = _h200_dump("complete")
    retired["entries"][-1].update(state="completed", retired=True)
    kind, _, reason, _ = _kind(_stall_folder(tmp_path, retired, SLEEPING_IN_TRAINING_STEP, event=event))
    assert kind == "no_hang", reason


def test_a_stall_folder_without_a_heartbeat_past_its_threshold_is_not_a_program_stall(tmp_path: Path) -> None:
    """A stall event's folder whose ranks dumped with their heartbeat under the step threshold
    (written by hand, or copied from a run) carries no confirmation of the stall."""
    retired = _h200_dump("complete")
    retired["entries"][-1].update(state="completed", retired=True)
    kind, _, reason, _ = _kind(_stall_folder(tmp_path, retired, SLEEPING_IN_TRAINING_STEP, heartbeat_age=2.0))
    assert kind == "no_hang", reason


def test_summarize_reports_a_program_stall_as_a_hang(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _stall_folder(tmp_path, _h200_dump("complete"), SLEEPING_IN_TRAINING_STEP)
    assert main(["summarize", str(folder)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("KIND: program_stalled - ")
    assert "NO HANG" not in out and "nothing is wrong" not in out
    assert main(["summarize", str(folder), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["verdict"], data["hang_kind"], data["culprit_ranks"]) == ("stalled", "program_stalled", [])
    assert data["headline"].startswith("program_stalled: ")
