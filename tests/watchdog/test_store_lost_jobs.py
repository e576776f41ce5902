"""When the job's store dies with its host, the evidence survives. Real 3-rank Lightning jobs on
gloo: rank 1 all_reduces 8 floats where the others all_reduce 3, and gloo aborts rank 0. Started
by hand, rank 0's process hosts the TCPStore: ranks 1 and 2 then fail ("Connection closed by
peer") and cannot reach the store, so each writes its own dump, stacks and a note into
``store-lost-001``, and ``lightning-ncclx summarize`` of that folder names rank 0 missing. Under
torchrun the store lives in its agent (c10d rendezvous): the usual event, one summary naming
rank 0's process gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import PYTHON, clean_env, contexts, run_job
from watchdog.harness import JOB, REPO, run_ranks_by_hand, start_job, wait_for

pytestmark = pytest.mark.timeout(300)


def test_without_the_store_every_surviving_rank_dumps_and_summarize_names_the_missing_rank(tmp_path: Path) -> None:
    result = run_ranks_by_hand(tmp_path, 3, "--fault", "bigger_all_reduce", "--fault-rank", "1",
                               "--strategy", "ddp_ncclx", "--on-stall", "dump")
    assert result.returncode is not None, result.log[-6000:]  # every rank ended by itself
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in result.log  # rank 0 aborted
    folder = result.dump_dir / "store-lost-001"
    found = contexts(folder)
    assert sorted(found) == [1, 2], f"{sorted(found)}\n{result.log[-6000:]}"
    for rank, ctx in found.items():
        assert ctx["event"] == "store-lost-001" and ctx["reason"] in ("exception", "stall"), ctx
        assert "the job's store could not be reached" in ctx["store_lost"], ctx
        assert (folder / ctx["stacks_file"]).is_file() and all((folder / f).is_file() for f in ctx["trace_files"])
    done = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(folder), "--format", "json"],
                          capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=120)
    assert done.returncode == 1, done.stderr  # a finding
    summary = json.loads(done.stdout)
    assert summary["ranks_missing"] == [0] and summary["ranks_seen"] == [1, 2], summary["ranks_missing"]
    assert any(f["ranks"] == [0] for f in summary["findings"]), [f["message"] for f in summary["findings"]]


def test_with_the_store_apart_from_rank_0_the_event_is_summarized_as_usual(tmp_path: Path) -> None:
    torchrun = str(Path(PYTHON).parent / "torchrun")
    dump_dir = tmp_path / "dumps"
    result = run_job([torchrun, "--standalone", "--nproc_per_node=3", str(JOB), "--fault", "bigger_all_reduce",
                      "--fault-rank", "1", "--devices", "3", "--dump-dir", str(dump_dir), "--strategy", "ddp_ncclx",
                      "--on-stall", "dump"], cwd=tmp_path, env=clean_env({"OMP_NUM_THREADS": "1"}), timeout=240)
    assert not result.timed_out, result.tail(80)
    events = sorted(p for p in dump_dir.iterdir() if p.is_dir() and p.name.startswith(("exception-", "stall-")))
    assert len(events) == 1 and not list(dump_dir.glob("store-lost-*")), (events, result.tail(80))
    collection = json.loads((events[0] / "collection.json").read_text())
    assert 0 in collection["missing_ranks"] and 0 in collection["gone_ranks"], collection
    summary = json.loads((events[0] / "summary.json").read_text())
    assert 0 in summary["ranks_missing"], summary["ranks_missing"]


def test_a_frozen_store_host_leaves_every_other_rank_dumping_on_its_own(tmp_path: Path) -> None:
    """Rank 0's process, which hosts the store, is stopped (``SIGSTOP``): the store keeps its
    connections open and answers nothing, as a frozen or powered-off host does. torch's store
    client waits for such an answer as long as the kernel keeps the connection (~15 min); the
    plugin gives each request up after its deadline, so ranks 1 and 2, stuck in their step's
    all_reduce past the 6 s threshold, each write their own dump into ``store-lost-001``."""
    job = start_job(tmp_path, "--strategy", "ddp_ncclx", "--step-sleep", "0.25", "--batches", "14", "--at-batch", "6",
                    "--fault", "freeze", "--fault-rank", "0", "--train-step-seconds", "6", "--no-auto",
                    "--on-stall", "dump")
    folder = job.dump_dir / "store-lost-001"
    try:
        dumped = wait_for(lambda: sorted(contexts(folder)) == [1, 2] if folder.is_dir() else False, 150)
    finally:
        job.stop()
    assert dumped, f"{sorted(contexts(folder)) if folder.is_dir() else 'no folder'}\n{job.log()[-6000:]}"
    for rank, ctx in contexts(folder).items():
        assert ctx["reason"] == "stall" and "the job's store could not be reached" in ctx["store_lost"], ctx
        assert "answered nothing" in ctx["store_lost"] or "still waiting" in ctx["store_lost"] \
            or "connecting to the job's store failed" in ctx["store_lost"], ctx["store_lost"]
