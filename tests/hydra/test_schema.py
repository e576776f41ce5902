"""The ncclx schema in Hydra's ConfigStore: wrong keys and types fail at compose time."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ValidationError

from lightning_ncclx.config import StallAction, ncclx_config_from
from lightning_ncclx.errors import ConfigError


def _message(error: BaseException) -> str:
    parts = []
    while error is not None:
        parts.append(str(error))
        error = error.__cause__
    return "\n".join(parts)


def test_overrides_reach_the_typed_ncclx_block(compose) -> None:
    cfg = compose("train_fsdp", ["ncclx.flight_recorder.buffer_size=1234", "ncclx.watchdog.train_step_seconds=120",
                                 "ncclx.watchdog.on_stall=dump_and_exit", "ncclx.flight_recorder.dump_dir=/tmp/x"])
    ncclx = ncclx_config_from(cfg.ncclx)
    assert ncclx.flight_recorder.buffer_size == 1234
    assert ncclx.watchdog.train_step_seconds == 120.0
    assert ncclx.watchdog.on_stall is StallAction.dump_and_exit
    assert ncclx.flight_recorder.dump_dir == "/tmp/x"


def test_a_value_of_the_wrong_type_fails_naming_the_key(compose) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose("train_fsdp", ["ncclx.flight_recorder.buffer_size=abc"])
    text = _message(info.value)
    assert "Value 'abc' of type 'str' could not be converted to Integer" in text
    assert "ncclx.flight_recorder.buffer_size" in text
    assert isinstance(info.value.__cause__, ValidationError)


def test_a_float_field_given_auto_fails(compose) -> None:
    with pytest.raises(ConfigCompositionException, match="ncclx.watchdog.train_step_seconds=auto"):
        compose("train_ddp", ["ncclx.watchdog.train_step_seconds=auto"])


def test_an_enum_field_given_an_unknown_choice_fails(compose) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose("train_ddp", ["ncclx.watchdog.on_stall=explode"])
    assert "Invalid value 'explode', expected one of [dump, dump_and_exit]" in _message(info.value)


def test_a_typo_key_fails_naming_the_key_and_the_schema(compose) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose("train_fsdp", ["ncclx.watchdog.train_step_secs=120"])
    text = _message(info.value)
    assert "Key 'train_step_secs' not in 'WatchdogConfig'" in text
    assert isinstance(info.value.__cause__, ConfigAttributeError)


def test_a_typo_key_forced_in_with_plus_fails_when_the_strategy_converts_it(compose) -> None:
    # Hydra lets `+key=value` past a struct schema on purpose; NcclxConfig then refuses it.
    cfg = compose("train_fsdp", ["+ncclx.flight_recorder.bufer_size=1"])
    with pytest.raises(ConfigError, match="bufer_size"):
        ncclx_config_from(cfg.ncclx)


def test_range_checks_run_when_the_config_is_converted(compose) -> None:
    cfg = compose("train_fsdp", ["ncclx.watchdog.exit_code=0"])  # the schema has no ranges
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.exit_code=0 is not valid"):
        ncclx_config_from(cfg.ncclx)
