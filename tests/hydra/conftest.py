from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
EXAMPLES = REPO / "examples"


@pytest.fixture
def compose():
    """``compose(config_name, overrides)`` against the examples' conf/ tree (plus the packaged
    groups the search-path plugin adds)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    sys.path.insert(0, str(EXAMPLES))

    def _compose(config_name: str = "train_fsdp", overrides: list[str] | None = None):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=overrides or [])

    yield _compose
    GlobalHydra.instance().clear()
    sys.path.remove(str(EXAMPLES))
