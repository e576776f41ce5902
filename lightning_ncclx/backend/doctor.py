"""``lightning-ncclx doctor``: what this machine's torch, Lightning and NCCL will do, and
whether the flight-recorder environment is sound. Exit code 1 when the set-up is broken."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from importlib import metadata


@dataclass
class SetupCheck:
    """What ``lightning-ncclx doctor`` found about this machine's set-up (rendered by
    :mod:`lightning_ncclx.cli.doctor` as a table or as JSON)."""

    versions: dict[str, str | None]
    nccl_resolution: str
    cuda_devices: list[str]
    backends: dict[str, bool]
    recorder_variables: dict[str, str]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def broken(self) -> bool:
        return bool(self.problems)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_setup() -> SetupCheck:
    from lightning_ncclx.backend.recorder_env import malformed_variables, recorder_variables_in_effect
    from lightning_ncclx.backend.resolve import nccl_resolution, probe_capabilities
    from lightning_ncclx.backend.torch_api import nccl_version

    import torch
    import torch.distributed as dist

    caps = probe_capabilities()
    devices = [torch.cuda.get_device_name(i) for i in range(caps.cuda_devices)]
    check = SetupCheck(
        versions={
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torch CUDA": torch.version.cuda,
            "NCCL": nccl_version(),
            "lightning": _version("lightning"),
            "pytorch_lightning": _version("pytorch-lightning"),
            "hydra-core": _version("hydra-core"),
            "lightning-ncclx": _version("lightning-ncclx"),
        },
        nccl_resolution=nccl_resolution(caps),
        cuda_devices=devices,
        backends={
            "distributed": dist.is_available(),
            "gloo": caps.gloo_available,
            "nccl": caps.nccl_built,
            "nccl2": caps.has_nccl2,
        },
        recorder_variables=recorder_variables_in_effect(),
    )
    if not dist.is_available():
        check.problems.append("torch.distributed is not available in this torch build")
    if not caps.gloo_available:
        check.problems.append("gloo is not available: CPU jobs and the tests cannot run")
    for name, why in malformed_variables().items():
        check.problems.append(f"{name}={os.environ.get(name)!r} is {why}")
    use_nccl2 = os.environ.get("TORCH_DIST_USE_NCCL2")
    if use_nccl2 is not None and use_nccl2 not in ("0", "1"):
        check.notes.append(f'TORCH_DIST_USE_NCCL2={use_nccl2!r}: only exactly "0" selects the legacy backend')
    if caps.cuda_devices == 0:
        check.notes.append("no CUDA device: ncclx strategies will use gloo (backend=auto)")
    if caps.has_nccl2 and caps.cuda_devices and not os.environ.get("TORCH_FR_BUFFER_SIZE"):
        check.notes.append("nccl2 records only through the flight-recorder hook; ncclx strategies set TORCH_FR_BUFFER_SIZE")
    return check
