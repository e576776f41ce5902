"""Turn the configured backend choice into the string ``init_process_group`` gets, refusing a
choice the installed torch or this machine cannot serve before any process group exists."""

from __future__ import annotations

import os
from dataclasses import dataclass

from lightning_ncclx.backend import torch_api
from lightning_ncclx.errors import BackendUnavailableError

NCCL_FAMILY = frozenset({"nccl", "nccl2", "nccl-legacy", "nccl-lazy"})


@dataclass(frozen=True)
class BackendCapabilities:
    """What the installed torch and this machine can serve."""

    torch_version: str
    has_nccl2: bool
    """torch registers "nccl2"/"nccl-lazy" and makes "nccl" build ProcessGroupNCCL2 (torch >= 2.15)."""
    has_legacy_name: bool
    """torch knows the name "nccl-legacy" (torch >= 2.15)."""
    nccl_built: bool
    gloo_available: bool
    cuda_devices: int
    nccl2_by_default: bool
    """With this environment, "nccl" builds nccl2 (TORCH_DIST_USE_NCCL2 is not "0")."""


def probe_capabilities() -> BackendCapabilities:
    import torch
    import torch.distributed as dist

    has_nccl2 = torch_api.has_nccl2()
    return BackendCapabilities(
        torch_version=torch.__version__.split("+")[0],
        has_nccl2=has_nccl2,
        has_legacy_name=has_nccl2,
        nccl_built=dist.is_available() and dist.is_nccl_available(),
        gloo_available=dist.is_available() and dist.is_gloo_available(),
        cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        nccl2_by_default=has_nccl2 and os.environ.get("TORCH_DIST_USE_NCCL2") != "0",
    )


def nccl_resolution(caps: BackendCapabilities) -> str:
    """What the name "nccl" builds here, and why, in one sentence."""
    if not caps.nccl_built:
        return f'"nccl" is not available: torch {caps.torch_version} was built without NCCL'
    if not caps.has_nccl2:
        return f'"nccl" builds the legacy ProcessGroupNCCL (torch {caps.torch_version} has no nccl2)'
    if caps.nccl2_by_default:
        return '"nccl" builds ProcessGroupNCCL2 (nccl2; TORCH_DIST_USE_NCCL2 is not "0")'
    return '"nccl" builds the legacy ProcessGroupNCCL because TORCH_DIST_USE_NCCL2=0'


def resolve_backend(choice: str, device_type: str, caps: BackendCapabilities) -> str:
    """The backend string for ``init_process_group``; raises BackendUnavailableError with the reason."""
    if choice == "auto":
        # Lightning's own choice for the device it picked: nccl on CUDA, gloo on anything else.
        # Lightning has already checked that its devices exist; only a torch without NCCL cannot serve it.
        if device_type == "cuda":
            if not caps.nccl_built:
                raise BackendUnavailableError(
                    f"ncclx.backend='auto' on the CUDA devices Lightning chose needs NCCL, but torch "
                    f"{caps.torch_version} was built without it; use accelerator='cpu' (gloo) or a CUDA build of torch"
                )
            return "nccl"
        _require_gloo(choice, caps)
        return "gloo"
    if choice == "gloo":
        _require_gloo(choice, caps)
        return "gloo"
    _require_nccl(choice, device_type, caps)
    if choice == "nccl-legacy":
        return "nccl-legacy" if caps.has_legacy_name else "nccl"
    if not caps.has_nccl2:
        raise BackendUnavailableError(
            f"ncclx.backend={choice!r} needs torch >= 2.15 (ProcessGroupNCCL2), but torch {caps.torch_version} "
            f"is installed; use backend=nccl-legacy or backend=auto"
        )
    return choice


def _require_gloo(choice: str, caps: BackendCapabilities) -> None:
    if not caps.gloo_available:
        raise BackendUnavailableError(f"ncclx.backend={choice!r} needs gloo, which this torch build lacks")


def _require_nccl(choice: str, device_type: str, caps: BackendCapabilities) -> None:
    if device_type != "cuda":
        raise BackendUnavailableError(
            f"ncclx.backend={choice!r} needs CUDA devices, but this job runs on {device_type!r}; "
            f"use backend=gloo or backend=auto (gloo on CPU)"
        )
    if not caps.nccl_built:
        raise BackendUnavailableError(
            f"ncclx.backend={choice!r} needs NCCL, but torch {caps.torch_version} was built without it"
        )
    if caps.cuda_devices == 0:
        raise BackendUnavailableError(
            f"ncclx.backend={choice!r} needs at least one CUDA device, and torch sees none on this machine "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
        )


def is_nccl_family(backend: str | None) -> bool:
    return backend is not None and backend.split(":")[-1] in NCCL_FAMILY
