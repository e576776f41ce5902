"""examples/slurm: the sbatch script and the hydra-submitit-launcher recipe are well-formed and
agree with the Hydra app (no SLURM and no submitit needed)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

from support import PYTHON, clean_env

SLURM_DIR = Path(__file__).resolve().parents[2] / "examples" / "slurm"


def test_scripts_parse_as_bash() -> None:
    for name in ("train.sbatch", "gather_dumps.sh"):
        done = subprocess.run(["bash", "-n", str(SLURM_DIR / name)], capture_output=True, text=True)
        assert done.returncode == 0, f"{name}: {done.stderr}"


def test_sbatch_runs_one_task_per_device_with_srun_and_node_local_dumps() -> None:
    text = (SLURM_DIR / "train.sbatch").read_text()
    assert re.search(r"^#SBATCH --ntasks-per-node=\d+", text, re.M)
    assert "srun " in text and "torchrun" not in text.split("srun ", 1)[1].split("\n", 1)[0]
    assert 'trainer.devices="${SLURM_NTASKS_PER_NODE}"' in text and 'trainer.num_nodes="${SLURM_NNODES}"' in text
    assert "LOCAL_DUMPS='$TMPDIR/ncclx_dumps/slurm-$SLURM_JOB_ID'" in text  # expanded per rank, not by sbatch
    assert "gather_dumps.sh node" in text and "gather_dumps.sh merge" in text


def test_submitit_launcher_recipe_resolves_against_the_app_config() -> None:
    app = OmegaConf.load(SLURM_DIR / "conf" / "config.yaml")
    launcher = OmegaConf.load(SLURM_DIR / "conf" / "hydra" / "launcher" / "slurm.yaml")
    assert list(launcher.pop("defaults")) == ["submitit_slurm"]
    root = OmegaConf.merge(app, {"trainer": {"num_nodes": 2, "devices": 4}},
                           {"hydra": {"launcher": launcher, "runtime": {"cwd": "/shared/repo"},
                                      "job": {"name": "train"}, "sweep": {"dir": "logs/multirun/x"}}})
    resolved = OmegaConf.to_container(root.hydra.launcher, resolve=True)
    assert resolved["nodes"] == 2 and resolved["tasks_per_node"] == 4 and resolved["gpus_per_node"] == 4
    setup = "\n".join(resolved["setup"])
    assert "/shared/repo/logs/multirun/x/ncclx_dumps" in setup and "/shared/repo/examples/slurm/gather_dumps.sh" in setup
    assert "trap " in setup and " EXIT" in setup


def test_app_config_points_dumps_at_node_local_disk(tmp_path: Path) -> None:
    code = ("from omegaconf import OmegaConf; c = OmegaConf.load('conf/config.yaml'); "
            "print(c.ncclx.flight_recorder.dump_dir)")
    done = subprocess.run([PYTHON, "-c", code], cwd=SLURM_DIR, capture_output=True, text=True, timeout=60,
                          env=clean_env({"TMPDIR": str(tmp_path), "SLURM_JOB_ID": "123"}))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{tmp_path}/ncclx_dumps/slurm-123"
