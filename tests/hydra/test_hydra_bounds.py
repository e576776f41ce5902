"""Values out of range through Hydra, as a user overrides them on the command line: the schema
takes them (it has types, not ranges) and the strategy's conversion refuses each one, naming it."""

from __future__ import annotations

import pytest

from lightning_ncclx.config import ncclx_config_from
from lightning_ncclx.errors import ConfigError


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ncclx.flight_recorder.buffer_size=2147483648",
         r"ncclx.flight_recorder.buffer_size=2147483648 is not valid: expected an integer from 0 to 2147483647"),
        ("ncclx.watchdog.poll_interval_seconds=1e-9", r"ncclx.watchdog.poll_interval_seconds=1e-09 is not valid"),
        ("ncclx.watchdog.exit_codes.rank_lost=0", r"ncclx.watchdog.exit_codes.rank_lost=0 is not valid"),
        ("ncclx.watchdog.on_demand_file=''", r"ncclx.watchdog.on_demand_file='' is not valid"),
        ("ncclx.watchdog.on_demand_file='  '", r"ncclx.watchdog.on_demand_file='  ' is not valid"),
        ("ncclx.watchdog.collect_timeout_seconds=1e12",
         r"ncclx.watchdog.collect_timeout_seconds=1000000000000.0 is not valid"),
        ("ncclx.straggler.poll_interval_seconds=1e-9", r"ncclx.straggler.poll_interval_seconds=1e-09 is not valid"),
        ("ncclx.watchdog.auto.window=100000000000", r"ncclx.watchdog.auto.window=100000000000 is not valid"),
    ],
)
def test_an_out_of_range_override_is_refused_when_converted(compose, override: str, message: str) -> None:
    cfg = compose("train_fsdp", [override])
    with pytest.raises(ConfigError, match=message):
        ncclx_config_from(cfg.ncclx)


def test_a_boolean_written_no_reads_as_false_through_the_schema(compose) -> None:
    cfg = compose("train_fsdp", ["ncclx.watchdog.native_stacks=no", "ncclx.straggler.enabled='false'"])
    ncclx = ncclx_config_from(cfg.ncclx)
    assert ncclx.watchdog.native_stacks is False and ncclx.straggler.enabled is False
