"""Only the names the installed torch reads without a warning are exported.

torch's flight recorder reads its buffer size and C++-stack switch through one list of names, the
new one first (``getCvarBool({"TORCH_FR_CPP_STACK", "TORCH_NCCL_TRACE_CPP_STACK"})``), and warns
on every rank whenever the old name is set at all, even beside the new one. The real process below
hands what the strategy exports to the installed torch and starts a gloo group, whose recorder
reads them."""

from __future__ import annotations

import pytest

from lightning_ncclx.backend.recorder_env import apply_recorder_env
from lightning_ncclx.config import FlightRecorderConfig
from support import PYTHON, clean_env, run_job

READ_THROUGH_THE_RECORDERS_LIST = ("TORCH_NCCL_TRACE_CPP_STACK", "TORCH_NCCL_TRACE_BUFFER_SIZE")


@pytest.mark.parametrize("torch_version", ["2.11.0+cu130", "2.13.0", "2.15.0"])
def test_the_recorders_own_variables_go_out_under_their_new_names_only(torch_version: str, tmp_path) -> None:
    environ: dict[str, str] = {}
    apply_recorder_env(FlightRecorderConfig(cpp_stacks=True), tmp_path / "trace_", environ, torch_version=torch_version)
    assert environ["TORCH_FR_CPP_STACK"] == "1" and environ["TORCH_FR_BUFFER_SIZE"] == "20000"
    assert not set(READ_THROUGH_THE_RECORDERS_LIST) & set(environ), environ


GLOO_WITH_THE_EXPORTED_ENVIRONMENT = r"""
import os, sys
from pathlib import Path
from lightning_ncclx.backend.recorder_env import apply_recorder_env
from lightning_ncclx.config import FlightRecorderConfig

apply_recorder_env(FlightRecorderConfig(), Path(sys.argv[2]), torch_version=sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
print("group done", flush=True)
"""


@pytest.mark.parametrize("as_if_torch", ["2.13.0", "2.15.0"])
def test_the_installed_torch_prints_no_deprecation_warning(as_if_torch: str, tmp_path) -> None:
    result = run_job([PYTHON, "-c", GLOO_WITH_THE_EXPORTED_ENVIRONMENT, as_if_torch, str(tmp_path / "trace_"),
                      str(tmp_path / "store")], env=clean_env(), timeout=120.0)
    assert result.returncode == 0 and "group done" in result.output, result.tail()
    assert "is deprecated; use" not in result.output, result.tail()
