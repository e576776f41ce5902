"""``ncclx.watchdog.exit_codes`` through Hydra: per-kind overrides reach exit_code_for, and a
misspelt kind is refused when the strategy converts the config."""

from __future__ import annotations

import pytest

from lightning_ncclx.config import exit_code_for, ncclx_config_from
from lightning_ncclx.errors import ConfigError


def test_defaults_and_an_override_per_kind(compose) -> None:
    watchdog = ncclx_config_from(compose("train_fsdp", ["ncclx.watchdog.exit_codes.rank_lost=90"]).ncclx).watchdog
    assert exit_code_for("rank_lost", watchdog) == 90
    assert exit_code_for("program_divergence", watchdog) == 76 and exit_code_for(None, watchdog) == 75


def test_a_misspelt_kind_is_refused(compose) -> None:
    cfg = compose("train_fsdp", ["+ncclx.watchdog.exit_codes.rank_gone=3"])
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.exit_codes.rank_gone=3 is not valid: unknown hang kind"):
        ncclx_config_from(cfg.ncclx)
