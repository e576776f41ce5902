"""Lightning strategies of lightning-ncclx: thin subclasses over one shared mixin.

Classes are imported lazily so that the Fabric flavour does not pull in ``lightning.pytorch``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DDPNcclxStrategy", "registered_pytorch_strategies"]


def registered_pytorch_strategies() -> list[type]:
    """Every ``lightning.pytorch`` strategy class whose names ``import lightning_ncclx`` registers."""
    from lightning_ncclx.strategies.ddp import DDPNcclxStrategy

    return [DDPNcclxStrategy]


def __getattr__(name: str) -> Any:
    if name == "DDPNcclxStrategy":
        from lightning_ncclx.strategies.ddp import DDPNcclxStrategy

        return DDPNcclxStrategy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
