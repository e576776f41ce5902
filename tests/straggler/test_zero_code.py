"""Zero-code adoption: Lightning's own entry-point loading picks up the plugin's factories from installed
distribution metadata, and ``LIGHTNING_NCCLX_WATCH`` switches them on. Real Trainers in scripts
that never import lightning_ncclx themselves."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lightning_ncclx.zero_code import features_from_environment
from straggler.harness import REPO, run_job

OVERRIDES = "straggler.interval_steps=10 straggler.patience=2 straggler.poll_interval_seconds=0.2"
GROUPS = ("lightning.pytorch.callbacks_factory", "pytorch_lightning.callbacks_factory")


@pytest.fixture
def entry_point_path(tmp_path: Path) -> list[Path]:
    """A folder holding a ``*.dist-info`` with the entry points ``pyproject.toml`` declares, as pip
    installs them; empty when the installed lightning-ncclx already declares them (no doubles)."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    installed = {g for g in GROUPS if any(ep.value.startswith("lightning_ncclx.")
                                          for ep in importlib.metadata.entry_points(group=g))}
    if all(g in installed for g in GROUPS):
        return []
    site = tmp_path / "site"
    info = site / "lightning_ncclx_entry_points-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lightning-ncclx-entry-points\nVersion: 0.0.0\n")
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in declared[group].items()) + "\n"
                   for group in GROUPS)
    (info / "entry_points.txt").write_text(text)
    return [site]


SCRIPT = """
import sys
import torch
from {package} import Trainer
trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
print("CALLBACKS", sorted(type(c).__name__ for c in trainer.callbacks))
"""


def run_script(package: str, pythonpath: list[Path], watch: str | None, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_NCCLX", "TORCH_FR_"))}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(REPO), env.get("PYTHONPATH", "")])
    if watch is not None:
        env["LIGHTNING_NCCLX_WATCH"] = watch
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(package=package)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(line for line in done.stdout.splitlines() if line.startswith("CALLBACKS"))


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_the_variable_switches_the_entry_point_on(tmp_path: Path, entry_point_path: list[Path], package: str) -> None:
    assert "EnvironmentAdoption" in run_script(package, entry_point_path, "1", tmp_path)
    assert "EnvironmentAdoption" not in run_script(package, entry_point_path, None, tmp_path)


def test_overrides_configure_and_a_typo_fails_naming_the_key() -> None:
    from lightning_ncclx.errors import ConfigError
    from lightning_ncclx.zero_code import config_from_environment

    cfg = config_from_environment({"LIGHTNING_NCCLX_OVERRIDES": OVERRIDES + " watchdog.train_step_seconds=120"})
    assert (cfg.straggler.interval_steps, cfg.straggler.patience, cfg.watchdog.train_step_seconds) == (10, 2, 120)
    with pytest.raises(ConfigError, match="ncclx.straggler.threshold=0.9 is not valid"):
        config_from_environment({"LIGHTNING_NCCLX_OVERRIDES": "straggler.threshold=0.9"})
    with pytest.raises(ConfigError, match="intervals_steps"):
        config_from_environment({"LIGHTNING_NCCLX_OVERRIDES": "straggler.intervals_steps=5"})


def test_variable_values() -> None:
    assert features_from_environment({}) == ()
    assert features_from_environment({"LIGHTNING_NCCLX_WATCH": "0"}) == ()
    assert features_from_environment({"LIGHTNING_NCCLX_WATCH": "1"}) == ("watchdog", "straggler")
    assert features_from_environment({"LIGHTNING_NCCLX_WATCH": "straggler"}) == ("straggler",)
    assert features_from_environment({"LIGHTNING_NCCLX_WATCH": "Watchdog, bogus"}) == ("watchdog",)


@pytest.mark.timeout(300)
def test_stock_ddp_job_gets_watchdog_and_straggler_warning_without_code(tmp_path: Path,
                                                                        entry_point_path: list[Path]) -> None:
    job = (Path(__file__).parent / "jobs" / "straggler_job.py").read_text()
    assert "import lightning_ncclx\n" not in job  # the --attach none path imports nothing of the plugin's
    result = run_job(tmp_path, "--fault", "slow_compute", "--fault-rank", "3", "--attach", "none", "--step-ms", "200",
                     "--slow-fraction", "0.5",
                     extra_env={"LIGHTNING_NCCLX_WATCH": "1", "LIGHTNING_NCCLX_OVERRIDES": OVERRIDES},
                     pythonpath=entry_point_path)
    assert result.returncode == 0, result.log[-4000:]
    assert "callbacks: ['EnvironmentAdoption']" in result.log, result.log[-4000:]
    assert "callbacks after fit: ['EnvironmentAdoption', 'StallWatchdog', 'StragglerDetector']" in result.log
    warnings = result.warnings()
    assert len(warnings) == 1 and "rank 3 on " in warnings[0] and "forward" in warnings[0], warnings
