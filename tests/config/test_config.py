"""Config validation: every refusal names the dotted key and the bad value."""

from __future__ import annotations

import pytest

from lightning_ncclx.config import NcclxConfig, StallAction, WatchdogConfig, ncclx_config_from
from lightning_ncclx.errors import ConfigError


def test_defaults_are_valid_and_stall_thresholds_undercut_timeouts() -> None:
    cfg = NcclxConfig()
    assert cfg.watchdog.train_step_seconds < cfg.timeouts.training_timeout_seconds
    assert cfg.watchdog.first_step_seconds < cfg.timeouts.init_timeout_seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"backend": "nccl3"}, r"ncclx.backend='nccl3' is not valid: expected one of auto, nccl2"),
        ({"flight_recorder": {"buffer_size": "abc"}}, r"ncclx.flight_recorder.buffer_size='abc' is not valid"),
        ({"flight_recorder": {"buffer_size": True}}, r"ncclx.flight_recorder.buffer_size=True is not valid"),
        ({"flight_recorder": {"torch_dump_prefix": "a/b"}}, r"ncclx.flight_recorder.torch_dump_prefix='a/b'"),
        ({"timeouts": {"init_timeout_seconds": 100, "training_timeout_seconds": 200}},
         r"ncclx.timeouts.training_timeout_seconds=200 is longer than ncclx.timeouts.init_timeout_seconds=100"),
        ({"timeouts": {"warmup_steps": -1}}, r"ncclx.timeouts.warmup_steps=-1 is not valid"),
        ({"timeouts": {"training_timeout_seconds": float("nan")}}, r"ncclx.timeouts.training_timeout_seconds=nan"),
        ({"watchdog": {"on_stall": "explode"}}, r"ncclx.watchdog.on_stall='explode' is not valid: expected one of dump, dump_and_exit"),
        ({"watchdog": {"exit_code": 0}}, r"ncclx.watchdog.exit_code=0 is not valid"),
        ({"watchdog": {"poll_interval_seconds": 30}}, r"ncclx.watchdog.poll_interval_seconds=30 is not valid"),
        ({"watchdog": {"checkpoint_seconds": 600}}, r"ncclx.watchdog.checkpoint_seconds=600 must be shorter than ncclx.timeouts.training_timeout_seconds=600"),
        ({"watchdog": {"first_step_seconds": 2000}}, r"ncclx.watchdog.first_step_seconds=2000 must be shorter than ncclx.timeouts.init_timeout_seconds"),
        ({"watchdog": {"auto": {"multiplier": 1.0}}}, r"ncclx.watchdog.auto.multiplier=1.0 is not valid"),
        ({"watchdog": {"on_demand_signal": "SIGKILL"}}, r"ncclx.watchdog.on_demand_signal='SIGKILL'"),
        ({"watchdog": {"tresholds": 3}}, r"ncclx.watchdog has no key\(s\) \['tresholds'\]; expected enabled, "),
        ({"flightrecorder": {}}, r"ncclx has no key\(s\) \['flightrecorder'\]"),
    ],
)
def test_invalid_values_are_refused_naming_the_key(value: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ncclx_config_from(value)


def test_disabled_watchdog_skips_the_threshold_check() -> None:
    cfg = ncclx_config_from({"watchdog": {"enabled": False, "train_step_seconds": 900}})
    assert not cfg.watchdog.enabled


def test_strings_from_yaml_become_enums() -> None:
    cfg = ncclx_config_from({"watchdog": {"on_stall": "dump_and_exit"}, "flight_recorder": {"env_precedence": "environment"}})
    assert cfg.watchdog.on_stall is StallAction.dump_and_exit
    assert cfg.flight_recorder.env_precedence.value == "environment"


def test_omegaconf_dictconfig_is_accepted() -> None:
    from omegaconf import OmegaConf

    cfg = ncclx_config_from(OmegaConf.create({"backend": "gloo", "watchdog": {"train_step_seconds": 30}}))
    assert cfg.backend == "gloo"
    assert cfg.watchdog.train_step_seconds == 30


def test_auto_floor_above_fixed_threshold_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.auto.floor_seconds=60 is longer than ncclx.watchdog.train_step_seconds=30"):
        WatchdogConfig(train_step_seconds=30, auto={"floor_seconds": 60})
