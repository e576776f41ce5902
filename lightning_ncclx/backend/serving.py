"""What actually serves each device of a live process group."""

from __future__ import annotations

from typing import Any

from lightning_ncclx.backend import torch_api


def serving_implementations(group: Any = None) -> dict[str, str]:
    """device type -> "<backend name> (<class>)" for ``group`` (default: the world group)."""
    pg = group if group is not None else torch_api.default_group()
    if pg is None:
        return {}
    found: dict[str, str] = {}
    for device, backend in torch_api.group_backends(pg):
        name = backend.name() if hasattr(backend, "name") else "?"
        found[device.type] = f"{name} ({type(backend).__name__})"
    return found
