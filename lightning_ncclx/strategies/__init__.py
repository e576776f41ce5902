"""Lightning strategies of lightning-ncclx: thin subclasses over one shared mixin.

``DDPNcclxStrategy`` (``ddp_ncclx``, ``ddp_ncclx_spawn``), ``FSDPNcclxStrategy`` (``fsdp_ncclx``)
and ``FSDP2NcclxStrategy`` (``fsdp2_ncclx``). Classes are imported lazily so that the Fabric
flavour does not pull in ``lightning.pytorch`` and ``import lightning_ncclx`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DDPNcclxStrategy", "FSDP2NcclxStrategy", "FSDPNcclxStrategy", "registered_pytorch_strategies"]

_LAZY = {
    "DDPNcclxStrategy": "lightning_ncclx.strategies.ddp",
    "FSDPNcclxStrategy": "lightning_ncclx.strategies.fsdp",
    "FSDP2NcclxStrategy": "lightning_ncclx.strategies.fsdp2",
}


def registered_pytorch_strategies() -> list[type]:
    """Every ``lightning.pytorch`` strategy class whose names ``import lightning_ncclx`` registers."""
    from lightning_ncclx.strategies.ddp import DDPNcclxStrategy
    from lightning_ncclx.strategies.fsdp import FSDPNcclxStrategy
    from lightning_ncclx.strategies.fsdp2 import FSDP2NcclxStrategy

    return [DDPNcclxStrategy, FSDPNcclxStrategy, FSDP2NcclxStrategy]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
