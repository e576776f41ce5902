"""A user's own Hydra app (not the plugin's) gets the packaged groups and the schema through the
search-path plugin, and the plugin keeps torch and Lightning out of it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from support import PYTHON, run_job

APP = textwrap.dedent(
    """
    import json, sys
    import hydra
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="conf", config_name="app")
    def main(cfg):
        heavy = sorted(m for m in ("torch", "lightning", "lightning.pytorch", "pytorch_lightning") if m in sys.modules)
        print("RESULT " + json.dumps({"heavy": heavy, "cfg": OmegaConf.to_container(cfg)}))

    main()
    """
)
USER_CONFIG = "defaults:\n  - strategy: null\n  - _self_\n\nlr: 0.1\n"


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.yaml").write_text(USER_CONFIG)
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


def run_app(app: Path, *overrides: str):
    return run_job([PYTHON, str(app / "app.py"), f"hydra.run.dir={app / 'out'}", *overrides], cwd=app, timeout=60)


def result_of(output: str) -> dict:
    line = next(line for line in output.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_trivial_app_imports_neither_torch_nor_lightning(app: Path) -> None:
    result = run_app(app)
    assert result.returncode == 0, result.tail()
    assert result_of(result.output) == {"heavy": [], "cfg": {"lr": 0.1}}


def test_search_path_lists_the_packaged_conf_folder_as_a_file_path(app: Path) -> None:
    result = run_app(app, "--info", "searchpath")
    assert result.returncode == 0, result.tail()
    line = next(line for line in result.output.splitlines() if "lightning-ncclx" in line)
    assert "file://" in line and line.rstrip(" |").endswith("lightning_ncclx/conf")


def test_user_app_selects_fsdp_ncclx_and_overrides_ncclx_from_the_command_line(app: Path) -> None:
    result = run_app(app, "strategy=fsdp_ncclx", "ncclx.flight_recorder.buffer_size=20000",
                     "ncclx.watchdog.train_step_seconds=120")
    assert result.returncode == 0, result.tail()
    seen = result_of(result.output)
    assert seen["heavy"] == []
    cfg = seen["cfg"]
    assert cfg["trainer"]["strategy"]["_target_"] == "lightning_ncclx.strategies.FSDPNcclxStrategy"
    assert cfg["ncclx"]["watchdog"]["train_step_seconds"] == 120.0
    assert cfg["ncclx"]["flight_recorder"]["buffer_size"] == 20000


def test_user_app_gets_hydras_error_for_a_typo_key(app: Path) -> None:
    result = run_app(app, "strategy=fsdp2_ncclx", "ncclx.watchdog.train_step_secs=120")
    assert result.returncode == 1
    assert "Key 'train_step_secs' not in 'WatchdogConfig'" in result.output
    assert "full_key: ncclx.watchdog.train_step_secs" in result.output
