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


def register_fsdp_names(cls: Any, strategy_registry: Any) -> None:
    strategy_registry.register(
        "fsdp_ncclx", cls, override=True,
        description="FSDP on torch's NCCL backends with flight recorder and stall watchdog",
    )
    # FSDPStrategy refuses, on CPU, every name in the class's _registered_strategies list.
    if "fsdp_ncclx" not in cls._registered_strategies:
        cls._registered_strategies.append("fsdp_ncclx")


def register_fsdp2_names(cls: Any, strategy_registry: Any) -> None:
    strategy_registry.register(
        "fsdp2_ncclx", cls, override=True,
        description="FSDP2 (fully_shard) on torch's NCCL backends with flight recorder and stall watchdog",
    )
