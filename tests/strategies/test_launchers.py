"""ddp_ncclx through every launcher, with real processes and a real gloo process group."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import PYTHON, REPO_ROOT, clean_env, free_port, kill_session, run_job, start_job

JOB = Path(__file__).parent / "jobs" / "fit_job.py"
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
QUICK_WATCHDOG = {"watchdog": {"first_step_seconds": 120, "train_step_seconds": 60, "validation_seconds": 60, "checkpoint_seconds": 60}}


def read_ranks(out: Path, world_size: int) -> list[dict]:
    files = sorted(out.glob("rank_*.json"))
    assert [f.name for f in files] == [f"rank_{r}.json" for r in range(world_size)]
    return [json.loads(f.read_text()) for f in files]


def assert_ncclx_ran(ranks: list[dict], world_size: int, buffer_size: str = "20000") -> None:
    run_ids = {r["env"]["LIGHTNING_NCCLX_RUN_ID"] for r in ranks if "LIGHTNING_NCCLX_RUN_ID" in r["env"]}
    dump_dirs = {r["dump_dir"] for r in ranks}
    assert len(dump_dirs) == 1, f"ranks disagree on the dump folder: {dump_dirs}"
    assert len(run_ids) <= 1
    for seen in ranks:
        assert seen["world_size"] == world_size
        assert seen["strategy_class"].endswith("DDPNcclxStrategy")
        assert seen["backend"] == "gloo"
        assert seen["serving"]["cpu"].startswith("gloo")
        assert seen["env"]["TORCH_FR_BUFFER_SIZE"] == buffer_size
        assert seen["env"]["TORCH_FR_DUMP_TEMP_FILE"].startswith(seen["dump_dir"])
        assert "gloo:all_reduce" in seen["ops"], "DDP's gradient all-reduce is missing from the flight recorder"
        assert seen["callbacks"].count("StallWatchdog") == 1


@pytest.mark.parametrize("world_size", [2, 3])
def test_popen_registered_name(tmp_path: Path, world_size: int) -> None:
    result = run_job([PYTHON, str(JOB), "--out", str(tmp_path), "--devices", str(world_size)], cwd=tmp_path)
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, world_size)
    assert_ncclx_ran(ranks, world_size)
    assert "ddp_ncclx: backend asked=auto -> gloo" in result.output


def test_users_own_watchdog_replaces_the_default_one(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(JOB), "--out", str(tmp_path), "--devices", "2", "--user-watchdog", "42"], cwd=tmp_path)
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, 2)
    assert_ncclx_ran(ranks, 2)
    assert all(r["watchdog_train_step_seconds"] == [42.0] for r in ranks)


def test_spawn_registered_name_two_ranks(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(JOB), "--out", str(tmp_path), "--devices", "2", "--strategy", "ddp_ncclx_spawn"], cwd=tmp_path)
    assert result.returncode == 0, result.tail()
    assert_ncclx_ran(read_ranks(tmp_path, 2), 2)


def test_spawn_three_ranks_with_explicit_instance_settings(tmp_path: Path) -> None:
    settings = {
        **QUICK_WATCHDOG,
        "flight_recorder": {"buffer_size": 3000},
        "timeouts": {"init_timeout_seconds": 300, "training_timeout_seconds": 200, "warmup_steps": 2},
    }
    result = run_job(
        [PYTHON, str(JOB), "--out", str(tmp_path), "--devices", "3", "--strategy", "ddp_ncclx_spawn", "--instance", "--ncclx-json", json.dumps(settings)],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, 3)
    assert_ncclx_ran(ranks, 3, buffer_size="3000")
    for seen in ranks:
        assert set(seen["timeouts_at_end"].values()) == {200.0}, seen["timeouts_at_end"]


def test_instance_passed_to_trainer(tmp_path: Path) -> None:
    settings = {**QUICK_WATCHDOG, "timeouts": {"init_timeout_seconds": 300, "training_timeout_seconds": 100, "warmup_steps": 1}}
    result = run_job(
        [PYTHON, str(JOB), "--out", str(tmp_path), "--devices", "2", "--instance", "--ncclx-json", json.dumps(settings)],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, 2)
    assert_ncclx_ran(ranks, 2)
    assert all(set(r["timeouts_at_end"].values()) == {100.0} for r in ranks)


def test_torchrun_three_ranks(tmp_path: Path) -> None:
    result = run_job(
        [TORCHRUN, "--standalone", "--nproc_per_node=3", str(JOB), "--out", str(tmp_path), "--devices", "3",
         "--ncclx-json", json.dumps(QUICK_WATCHDOG)],
        cwd=tmp_path,
        timeout=150,
    )
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, 3)
    assert_ncclx_ran(ranks, 3)
    assert all(r["env"].get("LIGHTNING_NCCLX_RUN_ID") is None for r in ranks)
    assert "/torchrun-" in ranks[0]["dump_dir"], "torchrun's run id should name the dump folder"


def test_slurm_environment_ranks_started_by_hand(tmp_path: Path) -> None:
    port = free_port()
    procs = []
    try:
        for rank in range(2):
            env = clean_env({
                "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
                "SLURM_NODEID": "0", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "ncclx-test", "SLURM_NODELIST": "127.0.0.1",
                "MASTER_PORT": str(port),
            })
            procs.append(start_job([PYTHON, str(JOB), "--out", str(tmp_path), "--devices", "2",
                                    "--ncclx-json", json.dumps(QUICK_WATCHDOG)], env=env, cwd=tmp_path,
                                   log=tmp_path / f"slurm_{rank}.log"))
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            kill_session(p)
    logs = "\n".join((tmp_path / f"slurm_{r}.log").read_text() for r in range(2))
    assert codes == [0, 0], logs[-3000:]
    ranks = read_ranks(tmp_path, 2)
    assert_ncclx_ran(ranks, 2)
    assert ranks[0]["dump_dir"].endswith("slurm-4242")


def test_hydra_target_works_without_prior_import(tmp_path: Path) -> None:
    result = run_job(
        [PYTHON, str(JOB), "--out", str(tmp_path), "--devices", "2", "--hydra-target", "--ncclx-json", json.dumps(QUICK_WATCHDOG)],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.tail()
    assert_ncclx_ran(read_ranks(tmp_path, 2), 2)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"watchdog": {"train_step_seconds": 700}}, r"ncclx.watchdog.train_step_seconds=700 must be shorter than ncclx.timeouts.training_timeout_seconds=600"),
        ({"timeouts": {"training_timeout_seconds": 0}}, r"ncclx.timeouts.training_timeout_seconds=0 is not valid"),
        ({"backend": "nccl2"}, r"ncclx.backend='nccl2' needs CUDA devices, but this job runs on 'cpu'"),
        ({"backend": "mpi"}, r"ncclx.backend='mpi' is not valid"),
        ({"flight_recorder": {"buffer_size": -5}}, r"ncclx.flight_recorder.buffer_size=-5 is not valid"),
        ({"flight_recorder": {"dump_dir": "/proc/ncclx-dumps"}}, r"ncclx.flight_recorder.dump_dir: the dump folder '/proc/ncclx-dumps' is not writable"),
    ],
)
def test_bad_settings_are_refused_before_launch(tmp_path: Path, settings: dict, message: str) -> None:
    result = run_job([PYTHON, str(JOB), "--out", str(tmp_path), "--devices", "2", "--instance", "--ncclx-json", json.dumps(settings)],
                     cwd=tmp_path, timeout=60)
    assert result.returncode != 0
    assert re.search(message, result.output), result.tail()
    assert "Initializing distributed" not in result.output, "a process group was created before the refusal"
    assert not list(tmp_path.glob("rank_*.json"))


def test_fabric_ddp_ncclx_two_ranks(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(Path(__file__).parent / "jobs" / "fabric_job.py"), "--out", str(tmp_path)], cwd=tmp_path)
    assert result.returncode == 0, result.tail()
    ranks = read_ranks(tmp_path, 2)
    for seen in ranks:
        assert seen["strategy_class"] == "FabricDDPNcclxStrategy"
        assert seen["buffer"] == "20000"
        assert "gloo:all_reduce" in seen["ops"]
        assert set(seen["timeouts"].values()) == {600.0}, "ncclx_training_started() applies the training timeout"
