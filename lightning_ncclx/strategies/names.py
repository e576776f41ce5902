"""The registry names of the ncclx strategies, shared by every Lightning flavour."""

from __future__ import annotations

from typing import Any

DDP_NAMES = (("ddp_ncclx", "popen"), ("ddp_ncclx_spawn", "spawn"))


def register_ddp_names(cls: type, strategy_registry: Any) -> None:
    for name, start_method in DDP_NAMES:
        strategy_registry.register(
            name,
            cls,
            description=f"DDP on torch's NCCL backends with flight recorder and stall watchdog ({start_method})",
            override=True,
            start_method=start_method,
        )
