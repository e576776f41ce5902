"""fsdp_ncclx and fsdp2_ncclx in real 2-process CPU jobs (Lightning's popen launcher, gloo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import PYTHON, run_job

JOB = Path(__file__).parent / "jobs" / "fsdp_job.py"
QUICK = {"flight_recorder": {"buffer_size": 3000},
         "timeouts": {"init_timeout_seconds": 300, "training_timeout_seconds": 200, "warmup_steps": 2},
         "watchdog": {"first_step_seconds": 120, "train_step_seconds": 60, "validation_seconds": 60,
                      "checkpoint_seconds": 60}}
pytestmark = pytest.mark.timeout(200)


def read_ranks(out: Path, world_size: int) -> list[dict]:
    files = sorted(out.glob("rank_*.json"))
    assert [f.name for f in files] == [f"rank_{r}.json" for r in range(world_size)]
    return [json.loads(f.read_text()) for f in files]


def assert_ncclx_set_up(ranks: list[dict], cls: str, buffer_size: str, timeout: float) -> None:
    assert len({r["dump_dir"] for r in ranks}) == 1
    for seen in ranks:
        assert seen["strategy_class"] == cls
        assert seen["backend"] == "gloo" and seen["world_size"] == 2
        assert seen["env"]["TORCH_FR_BUFFER_SIZE"] == buffer_size
        assert seen["env"]["TORCH_FR_DUMP_TEMP_FILE"].startswith(seen["dump_dir"])
        assert "gloo:all_gather" in seen["ops"], "FSDP's parameter all-gather is missing from the flight recorder"
        assert seen["callbacks"].count("StallWatchdog") == 1
        assert set(seen["timeouts_at_end"].values()) == {timeout}


def test_fsdp_ncclx_by_name_shards_and_checkpoints_on_cpu(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(JOB), "--out", str(tmp_path), "--strategy", "fsdp_ncclx", "--checkpoint"],
                     cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, 2)
    assert_ncclx_set_up(ranks, "FSDPNcclxStrategy", "20000", 600.0)
    assert all(r["wrapped"] == "FullyShardedDataParallel" for r in ranks)
    assert "fsdp_ncclx: backend asked=auto -> gloo" in result.output
    assert (tmp_path / "final.ckpt").is_file()


def test_fsdp2_ncclx_instance_with_settings_shards_with_dtensors(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(JOB), "--out", str(tmp_path), "--strategy", "fsdp2_ncclx", "--instance",
                      "--ncclx-json", json.dumps(QUICK), "--checkpoint"], cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, 2)
    assert_ncclx_set_up(ranks, "FSDP2NcclxStrategy", "3000", 200.0)
    for seen in ranks:
        assert seen["param_types"] == ["DTensor"]
        assert seen["mesh"] == [2, 1]
    shards = {p.name for p in (tmp_path / "final.ckpt").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp"} <= shards, shards
