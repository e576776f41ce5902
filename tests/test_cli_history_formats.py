"""``lightning-ncclx history --format slurm|json``: the hosts behind repeated incidents as an
``--exclude=`` list and a Kubernetes node affinity; a host name that is not plain never reaches
them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.report import write_reports

sys.path.insert(0, str(Path(__file__).resolve().parent / "analysis"))
from synth import collectives, dump, write  # noqa: E402

GROUPS = {"0": ("default_pg", [0, 1, 2, 3])}


def _rank_lost(folder: Path, lost_host: str) -> None:
    """An event whose rank 2 (on ``lost_host``) is gone: a host-related kind."""
    folder.mkdir(parents=True)
    hosts = {0: "gpu-1", 1: "gpu-1", 2: lost_host, 3: "gpu-3"}
    for r in (0, 1, 3):
        write(folder, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8, last_state="started"), GROUPS))
    for r in range(4):
        (folder / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "host": hosts[r], "world_size": 4, "phase": "train_step", "time_unix": 1_790_000_000,
             "event": folder.name}))
    (folder / "collection.json").write_text(json.dumps({"gone_ranks": [2], "missing_ranks": [2]}))
    write_reports(analyze_folder(folder), folder)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for i, host in enumerate(["gpu-17", "gpu-17", "gpu-17", "gpu-9", "gpu-9"]):
        monkeypatch.setenv("LIGHTNING_NCCLX_RUN_ID", f"run-{i}")
        _rank_lost(tmp_path / f"run-{i}" / "ncclx_dumps" / "stall-001", host)
    return tmp_path


def _history(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "history", *args], capture_output=True,
                          text=True, env=dict(os.environ), timeout=120)


def test_slurm_format_prints_only_the_exclude_option(runs: Path) -> None:
    done = _history(str(runs), "--format", "slurm")
    assert done.returncode == 1, done.stderr
    assert done.stdout == "--exclude=gpu-17,gpu-9\n"


def test_slurm_format_prints_an_empty_line_when_no_host_recurs(runs: Path) -> None:
    done = _history(str(runs / "run-0"), "--format", "slurm")
    assert done.returncode == 0 and done.stdout == "\n", done.stderr


def test_json_format_carries_a_node_affinity_for_kubernetes(runs: Path) -> None:
    data = json.loads(_history(str(runs), "--format", "json").stdout)
    terms = data["node_affinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                            "values": ["gpu-17", "gpu-9"]}]}]
    assert data["exclude"] == ["gpu-17", "gpu-9"]
    alone = json.loads(_history(str(runs / "run-0"), "--format", "json").stdout)
    assert alone["node_affinity"] is None


def test_a_host_name_that_is_not_plain_stays_out_of_the_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    odd = "gpu-5;reboot"
    for i in range(3):
        monkeypatch.setenv("LIGHTNING_NCCLX_RUN_ID", f"run-{i}")
        _rank_lost(tmp_path / f"run-{i}" / "stall-001", odd)
    done = _history(str(tmp_path), "--format", "slurm")
    assert done.stdout == "\n" and "not a plain host name: 'gpu-5;reboot'" in done.stderr
    data = json.loads(_history(str(tmp_path), "--format", "json").stdout)
    assert data["node_affinity"] is None
