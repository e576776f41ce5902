"""What actually serves each device of a live process group, and the NCCL version."""

from __future__ import annotations

from typing import Any


def serving_implementations(group: Any = None) -> dict[str, str]:
    """device type -> "<backend name> (<class>)" for ``group`` (default: the world group)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    found: dict[str, str] = {}
    for device_type in getattr(pg, "_device_types", []) or []:
        device = torch.device(device_type) if isinstance(device_type, str) else device_type
        try:
            backend = pg._get_backend(device)
        except RuntimeError:
            continue
        name = backend.name() if hasattr(backend, "name") else "?"
        found[device.type] = f"{name} ({type(backend).__name__})"
    return found


def nccl_version() -> str | None:
    """The NCCL version torch links, or None when it has none or it cannot be read."""
    try:
        import torch

        if not torch.distributed.is_nccl_available():
            return None
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU-only machine may fail to load libnccl: no version, not an error
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)
