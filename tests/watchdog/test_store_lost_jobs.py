"""When the job's store dies with its host, the evidence survives: a real 3-rank Lightning job on
gloo whose ranks are started by hand; rank 1 all_reduces 8 floats where the others all_reduce 3,
and gloo aborts rank 0, whose process hosts the TCPStore. Ranks 1 and 2 then fail ("Connection
closed by peer") and cannot reach the store: each writes its own dump, stacks and a note into
``store-lost-001``, and ``lightning-ncclx summarize`` of that folder names rank 0 missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import clean_env, contexts
from watchdog.harness import REPO, run_ranks_by_hand

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
