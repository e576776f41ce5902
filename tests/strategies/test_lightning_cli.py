"""LightningCLI drives the ncclx strategies: by name, and as class_path/init_args with the typed
``ncclx`` block from the command line and from YAML; a misspelt key is named in the error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import PYTHON, REPO_ROOT, run_job

JOB = Path(__file__).parent / "jobs" / "cli_job.py"
QUIET = ["--trainer.accelerator=cpu", "--trainer.max_steps=2", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
YAML = """\
trainer:
  strategy:
    class_path: lightning_ncclx.strategies.DDPNcclxStrategy
    init_args:
      find_unused_parameters: true
      timeout: "0:15:00"
      ncclx:
        backend: gloo
        timeouts:
          warmup_steps: 1
        watchdog:
          train_step_seconds: 200
"""


def read_ranks(out: Path, world_size: int) -> list[dict]:
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(world_size)]


def test_strategy_by_name_on_two_ranks(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(JOB), "fit", f"--model.out={tmp_path}", "--trainer.strategy=ddp_ncclx",
                      "--trainer.devices=2", *QUIET], cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.tail()
    for seen in read_ranks(tmp_path, 2):
        assert (seen["strategy_class"], seen["world_size"], seen["backend"]) == ("DDPNcclxStrategy", 2, "gloo")


def test_class_path_and_typed_ncclx_from_yaml_and_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(YAML)
    result = run_job([PYTHON, str(JOB), "fit", f"--model.out={tmp_path}", f"--config={config}", "--trainer.devices=1", *QUIET,
                      "--trainer.strategy.init_args.ncclx.watchdog.train_step_seconds=120"], cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.tail()
    seen = read_ranks(tmp_path, 1)[0]
    ncclx = seen["ncclx"]
    assert seen["strategy_class"] == "DDPNcclxStrategy"
    assert ncclx["backend"] == "gloo" and ncclx["timeouts"]["warmup_steps"] == 1
    assert ncclx["watchdog"]["train_step_seconds"] == 120.0, "the command line overrides the YAML"
    assert ncclx["timeouts"]["init_timeout_seconds"] == 900.0 == seen["timeout_seconds"], "timeout= is the start-up timeout"


@pytest.mark.parametrize("where", ["command line", "yaml"])
def test_a_misspelt_ncclx_key_is_named(tmp_path: Path, where: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(YAML.replace("train_step_seconds: 200", "train_step_secnds: 200"))
    extra = [f"--config={config}"] if where == "yaml" else [
        "--trainer.strategy=lightning_ncclx.strategies.FSDP2NcclxStrategy",
        "--trainer.strategy.init_args.ncclx.watchdog.train_step_secnds=120",
    ]
    result = run_job([PYTHON, str(JOB), "fit", f"--model.out={tmp_path}", *extra, *QUIET], cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert "train_step_secnds" in result.output and "Initializing distributed" not in result.output, result.tail()


def test_a_bad_ncclx_value_is_refused_naming_the_key(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(JOB), "fit", f"--model.out={tmp_path}", "--trainer.strategy=lightning_ncclx.strategies.DDPNcclxStrategy",
                      "--trainer.strategy.init_args.ncclx.watchdog.train_step_seconds=700", *QUIET], cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert re.search(r"ncclx.watchdog.train_step_seconds=700(\.0)? must be shorter than ncclx.timeouts.training_timeout_seconds=600",
                     result.output), result.tail()


def test_the_example_runs(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(REPO_ROOT / "examples" / "train_cli.py"), "fit",
                      f"--config={REPO_ROOT / 'examples' / 'cli_ddp_ncclx.yaml'}", "--trainer.devices=1", "--trainer.max_steps=3",
                      "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"], cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.tail()
    assert "ddp_ncclx: backend asked=auto -> gloo" in result.output
