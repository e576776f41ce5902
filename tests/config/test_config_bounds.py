"""Every config field has a range and a type: a value that torch, a thread or the file system
cannot live with is refused through the Python API and through Hydra, naming the key, the value
and what is expected."""

from __future__ import annotations

import pytest

from lightning_ncclx.config import (MAX_BUFFER_SIZE, AlertsConfig, AutoThresholdConfig, ConsensusConfig,
                                    FlightRecorderConfig, NcclxConfig, StragglerConfig, TimeoutConfig,
                                    WatchdogConfig, ncclx_config_from)
from lightning_ncclx.errors import ConfigError

REFUSED = [
    ({"flight_recorder": {"buffer_size": 2**31}},
     r"ncclx.flight_recorder.buffer_size=2147483648 is not valid: expected an integer from 0 to 2147483647"),
    ({"flight_recorder": {"buffer_size": 10**12}}, r"ncclx.flight_recorder.buffer_size=1000000000000 is not valid"),
    ({"flight_recorder": {"dump_on_timeout": "no"}}, r"ncclx.flight_recorder.dump_on_timeout='no' is not valid: expected true or false"),
    ({"flight_recorder": {"cpp_stacks": "false"}}, r"ncclx.flight_recorder.cpp_stacks='false' is not valid"),
    ({"flight_recorder": {"stack_traces": 0}}, r"ncclx.flight_recorder.stack_traces=0 is not valid"),
    ({"flight_recorder": {"timing": "0"}}, r"ncclx.flight_recorder.timing='0' is not valid"),
    ({"flight_recorder": {"dump_dir": "/tmp/a\0b"}}, r"ncclx.flight_recorder.dump_dir='/tmp/a\\x00b' is not valid"),
    ({"flight_recorder": {"dump_dir": 7}}, r"ncclx.flight_recorder.dump_dir=7 is not valid"),
    ({"flight_recorder": {"torch_dump_prefix": "rank\0"}}, r"ncclx.flight_recorder.torch_dump_prefix='rank\\x00'"),
    ({"flight_recorder": {"torch_dump_prefix": " "}}, r"ncclx.flight_recorder.torch_dump_prefix=' ' is not valid"),
    ({"flight_recorder": {"torch_dump_prefix": "r" * 201}}, r"ncclx.flight_recorder.torch_dump_prefix='r+' is not valid"),
    ({"timeouts": {"init_timeout_seconds": 1e12, "training_timeout_seconds": 600}},
     r"ncclx.timeouts.init_timeout_seconds=1000000000000.0 is not valid: expected a finite number of seconds "
     r"greater than 0 and at most 2592000 \(30 days\)"),
    ({"watchdog": {"enabled": "no"}}, r"ncclx.watchdog.enabled='no' is not valid: expected true or false"),
    ({"watchdog": {"dump_on_exception": "false"}}, r"ncclx.watchdog.dump_on_exception='false' is not valid"),
    ({"watchdog": {"gather_through_store": "off"}}, r"ncclx.watchdog.gather_through_store='off' is not valid"),
    ({"watchdog": {"event_doorbell": None}}, r"ncclx.watchdog.event_doorbell=None is not valid"),
    ({"watchdog": {"native_stacks": 1}}, r"ncclx.watchdog.native_stacks=1 is not valid"),
    ({"watchdog": {"poll_interval_seconds": 1e-9}},
     r"ncclx.watchdog.poll_interval_seconds=1e-09 is not valid: expected a number of seconds from 0.01 \(a shorter one is a busy loop"),
    ({"watchdog": {"poll_interval_seconds": "0.5"}}, r"ncclx.watchdog.poll_interval_seconds='0.5' is not valid"),
    ({"watchdog": {"collect_timeout_seconds": 1e12}},
     r"ncclx.watchdog.collect_timeout_seconds=1000000000000.0 is not valid: .* at most 3600"),
    ({"watchdog": {"exit_code": True}}, r"ncclx.watchdog.exit_code=True is not valid: expected an exit code from 1 to 255"),
    ({"watchdog": {"exit_codes": {"rank_lost": 0}}},
     r"ncclx.watchdog.exit_codes.rank_lost=0 is not valid: expected an exit code from 1 to 255"),
    ({"watchdog": {"exit_codes": {"program_divergence": 0}}}, r"ncclx.watchdog.exit_codes.program_divergence=0"),
    ({"watchdog": {"on_demand_file": ""}}, r"ncclx.watchdog.on_demand_file='' is not valid: expected a plain file name"),
    ({"watchdog": {"on_demand_file": "   "}}, r"ncclx.watchdog.on_demand_file='   ' is not valid"),
    ({"watchdog": {"on_demand_file": "DUMP\0NOW"}}, r"ncclx.watchdog.on_demand_file='DUMP\\x00NOW' is not valid"),
    ({"watchdog": {"on_demand_file": " DUMP_NOW"}}, r"ncclx.watchdog.on_demand_file=' DUMP_NOW' is not valid"),
    ({"watchdog": {"on_demand_file": "d" * 256}}, r"ncclx.watchdog.on_demand_file='d+' is not valid"),
    ({"watchdog": {"auto": {"enabled": "no"}}}, r"ncclx.watchdog.auto.enabled='no' is not valid: expected true or false"),
    ({"watchdog": {"auto": {"window": True}}}, r"ncclx.watchdog.auto.window=True is not valid"),
    ({"watchdog": {"auto": {"window": 10**20}}}, r"ncclx.watchdog.auto.window=100000000000000000000 is not valid"),
    ({"watchdog": {"auto": {"multiplier": 1e300}}}, r"ncclx.watchdog.auto.multiplier=1e\+300 is not valid"),
    ({"watchdog": {"auto": "on"}}, r"ncclx.watchdog.auto='on' is not valid: expected a mapping of AutoThresholdConfig keys"),
    ({"watchdog": {"auto": {"windw": 3}}}, r"ncclx.watchdog.auto has no key\(s\) \['windw'\]"),
    ({"watchdog": {"consensus": {"enabled": "false"}}}, r"ncclx.watchdog.consensus.enabled='false' is not valid"),
    ({"watchdog": {"consensus": {"min_wait_seconds": 1e12}}}, r"ncclx.watchdog.consensus.min_wait_seconds=1000000000000.0"),
    ({"straggler": {"enabled": "no"}}, r"ncclx.straggler.enabled='no' is not valid: expected true or false"),
    ({"straggler": {"cuda_events": "no"}}, r"ncclx.straggler.cuda_events='no' is not valid"),
    ({"straggler": {"poll_interval_seconds": 1e-9}}, r"ncclx.straggler.poll_interval_seconds=1e-09 is not valid"),
    ({"straggler": {"poll_interval_seconds": 1e6}}, r"ncclx.straggler.poll_interval_seconds=1000000.0 is not valid"),
    ({"alerts": {"enabled": "no"}}, r"ncclx.alerts.enabled='no' is not valid: expected true or false"),
    ({"watchdog": "dump"}, r"ncclx.watchdog='dump' is not valid: expected a mapping of WatchdogConfig keys"),
]


@pytest.mark.parametrize(("value", "message"), REFUSED)
def test_out_of_range_or_mistyped_values_are_refused_naming_key_and_value(value: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ncclx_config_from(value)


def test_the_dataclasses_refuse_them_when_built_directly() -> None:
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.enabled='no'"):
        WatchdogConfig(enabled="no")
    with pytest.raises(ConfigError, match=r"ncclx.flight_recorder.buffer_size=2147483648"):
        FlightRecorderConfig(buffer_size=2**31)
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.auto.enabled='false'"):
        AutoThresholdConfig(enabled="false")
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.consensus.enabled='no'"):
        ConsensusConfig(enabled="no")
    with pytest.raises(ConfigError, match=r"ncclx.straggler.enabled='no'"):
        StragglerConfig(enabled="no")
    with pytest.raises(ConfigError, match=r"ncclx.timeouts.init_timeout_seconds=1e\+300"):
        TimeoutConfig(init_timeout_seconds=1e300, training_timeout_seconds=1e300)
    with pytest.raises(ConfigError, match=r"ncclx.alerts.enabled='yes'"):
        AlertsConfig(enabled="yes")


def test_the_edges_of_each_range_are_accepted() -> None:
    cfg = NcclxConfig(
        flight_recorder={"buffer_size": MAX_BUFFER_SIZE, "dump_dir": "/tmp/dumps", "torch_dump_prefix": "r" * 200},
        timeouts={"init_timeout_seconds": 30 * 24 * 3600.0, "training_timeout_seconds": 600},
        watchdog={"poll_interval_seconds": 0.01, "collect_timeout_seconds": 3600, "exit_codes": {"rank_lost": 1},
                  "on_demand_file": "d" * 255, "enabled": False, "auto": {"window": 10_000}},
        straggler={"poll_interval_seconds": 60},
    )
    assert cfg.flight_recorder.buffer_size == 2**31 - 1
    assert NcclxConfig(watchdog={"poll_interval_seconds": 5.0}).watchdog.poll_interval_seconds == 5.0
    assert NcclxConfig(straggler={"poll_interval_seconds": 0.01}).straggler.poll_interval_seconds == 0.01


def test_overrides_without_the_schema_read_no_as_false_and_refuse_a_quoted_string() -> None:
    """LIGHTNING_NCCLX_OVERRIDES goes through OmegaConf without the typed schema: YAML reads a bare
    no as false, and a quoted 'no' stays a string, which would have read as true."""
    from lightning_ncclx.zero_code import config_from_environment

    assert config_from_environment({"LIGHTNING_NCCLX_OVERRIDES": "watchdog.enabled=no"}).watchdog.enabled is False
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.enabled='no' is not valid: expected true or false"):
        config_from_environment({"LIGHTNING_NCCLX_OVERRIDES": "watchdog.enabled=\"'no'\""})
