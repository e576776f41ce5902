"""The flight-recorder environment: built purely from config, applied with a documented precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_ncclx.backend.recorder_env import (
    apply_recorder_env,
    build_recorder_env,
    malformed_variables,
    resolve_recorder_env,
    torch_reads_legacy_names,
)
from lightning_ncclx.config import MAX_BUFFER_SIZE, EnvPrecedence, FlightRecorderConfig
from lightning_ncclx.errors import ConfigError
from support import PYTHON, clean_env, run_job

PREFIX = Path("/dumps/torch/nccl_trace_rank_")


def test_build_never_exports_an_empty_or_malformed_value() -> None:
    env = build_recorder_env(FlightRecorderConfig(buffer_size=0, cpp_stacks=False, timing=True), PREFIX)
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "0",
        "TORCH_FR_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(PREFIX),
        "TORCH_FR_CPP_STACK": "0",
        "TORCH_NCCL_ENABLE_TIMING": "1",
    }
    assert malformed_variables(env) == {}


def test_config_precedence_replaces_and_reports_a_differing_user_value() -> None:
    environ = {"TORCH_FR_BUFFER_SIZE": "2000"}
    to_set, conflicts = apply_recorder_env(FlightRecorderConfig(), PREFIX, environ, torch_version="2.15.0")
    assert environ["TORCH_FR_BUFFER_SIZE"] == "20000"
    assert [c.variable for c in conflicts] == ["TORCH_FR_BUFFER_SIZE"]
    message = conflicts[0].message()
    assert "'2000'" in message and "'20000'" in message and "env_precedence=config" in message


def test_environment_precedence_keeps_the_user_value() -> None:
    environ = {"TORCH_FR_BUFFER_SIZE": "500"}
    cfg = FlightRecorderConfig(env_precedence=EnvPrecedence.environment)
    to_set, conflicts = apply_recorder_env(cfg, PREFIX, environ, torch_version="2.15.0")
    assert environ["TORCH_FR_BUFFER_SIZE"] == "500"
    assert "TORCH_FR_BUFFER_SIZE" not in to_set
    assert "using '500'" in conflicts[0].message()


def test_deprecated_alias_set_by_the_user_is_reported_and_shadowed() -> None:
    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}
    to_set, conflicts = resolve_recorder_env({"TORCH_FR_BUFFER_SIZE": "20000"}, EnvPrecedence.config, environ)
    assert to_set == {"TORCH_FR_BUFFER_SIZE": "20000"}
    assert conflicts[0].variable == "TORCH_NCCL_TRACE_BUFFER_SIZE"


@pytest.mark.parametrize("bad", ["", "abc", "2000x", " 20"])
def test_malformed_user_value_that_would_win_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"TORCH_FR_BUFFER_SIZE=.* is set in the environment .* not an integer"):
        resolve_recorder_env({"TORCH_FR_BUFFER_SIZE": "20000"}, EnvPrecedence.environment, {"TORCH_FR_BUFFER_SIZE": bad})


def test_malformed_user_value_is_overwritten_under_config_precedence() -> None:
    environ = {"TORCH_FR_CPP_STACK": ""}
    apply_recorder_env(FlightRecorderConfig(), PREFIX, environ, torch_version="2.15.0")
    assert environ["TORCH_FR_CPP_STACK"] == "0"


def test_legacy_names_only_for_older_torch() -> None:
    assert not torch_reads_legacy_names("2.15.0+cu132")
    assert torch_reads_legacy_names("2.13.0+cpu")
    old: dict[str, str] = {}
    apply_recorder_env(FlightRecorderConfig(), PREFIX, old, torch_version="2.11.0")
    assert old["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and old["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(PREFIX)
    new: dict[str, str] = {}
    apply_recorder_env(FlightRecorderConfig(), PREFIX, new, torch_version="2.15.0")
    assert not any(k.startswith("TORCH_NCCL_") and k != "TORCH_NCCL_ENABLE_TIMING" for k in new)


def test_malformed_variables_names_each_problem() -> None:
    found = malformed_variables({"TORCH_FR_BUFFER_SIZE": "", "TORCH_FR_CPP_STACK": "", "TORCH_NCCL_TRACE_BUFFER_SIZE": "-5"})
    assert set(found) == {"TORCH_FR_BUFFER_SIZE", "TORCH_FR_CPP_STACK", "TORCH_NCCL_TRACE_BUFFER_SIZE"}
    assert "negative" in found["TORCH_NCCL_TRACE_BUFFER_SIZE"]


@pytest.mark.parametrize("value", ["2147483648", "4294967296", "99999999999"])
def test_a_size_past_torchs_c_int_is_refused(value: str) -> None:
    found = malformed_variables({"TORCH_FR_BUFFER_SIZE": value})
    assert "over 2147483647, the largest size torch reads" in found["TORCH_FR_BUFFER_SIZE"]
    with pytest.raises(ConfigError, match=rf"TORCH_FR_BUFFER_SIZE='{value}' .* over 2147483647"):
        resolve_recorder_env({"TORCH_FR_BUFFER_SIZE": "20000"}, EnvPrecedence.environment, {"TORCH_FR_BUFFER_SIZE": value})


def test_a_non_ascii_digit_is_not_an_integer() -> None:
    # str.isdigit() takes '²' and int() then raises: the check must say why, not raise.
    assert "not an integer" in malformed_variables({"TORCH_NCCL_TRACE_BUFFER_SIZE": "²"})["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    assert malformed_variables({"TORCH_FR_BUFFER_SIZE": str(MAX_BUFFER_SIZE)}) == {}


GLOO_WITH_ONE_ALL_REDUCE = """
import torch, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 1, True)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
print("trained")
"""


def test_torch_takes_the_largest_size_the_config_accepts(tmp_path: Path) -> None:
    """The cap is not above torch's limit: the largest accepted size creates a gloo group and runs
    a collective (2**31 hangs group creation, larger sizes abort: see MAX_BUFFER_SIZE)."""
    result = run_job([PYTHON, "-c", GLOO_WITH_ONE_ALL_REDUCE], env=clean_env({"TORCH_FR_BUFFER_SIZE": str(MAX_BUFFER_SIZE)}),
                     cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and "trained" in result.output, result.tail()


def test_doctor_flags_sizes_torch_cannot_read_without_a_traceback() -> None:
    env = clean_env({"TORCH_FR_BUFFER_SIZE": "2147483648", "TORCH_NCCL_TRACE_BUFFER_SIZE": "²"})
    result = run_job([PYTHON, "-m", "lightning_ncclx.cli", "doctor", "--json"], env=env, timeout=120)
    assert result.returncode == 1, result.tail()
    assert "over 2147483647, the largest size torch reads" in result.output
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in result.output and "not an integer" in result.output
    assert "Traceback" not in result.output
