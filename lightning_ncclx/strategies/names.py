"""The registry names of the ncclx strategies, shared by every Lightning flavour."""

from __future__ import annotations

from typing import Any

# Lightning's DDP names with "ddp" spelt "ddp_ncclx": start method, then find_unused_parameters.
DDP_NAMES = (("ddp_ncclx", "popen"), ("ddp_ncclx_spawn", "spawn"), ("ddp_ncclx_fork", "fork"), ("ddp_ncclx_notebook", "fork"))


def register_ddp_names(cls: type, strategy_registry: Any) -> None:
    for name, start_method in DDP_NAMES:
        strategy_registry.register(
            name,
            cls,
            description=f"DDP on torch's NCCL backends with flight recorder and stall watchdog ({start_method})",
            override=True,
            start_method=start_method,
        )
        for find_unused in (False, True):
            strategy_registry.register(
                f"{name}_find_unused_parameters_{str(find_unused).lower()}",
                cls,
                description=f"{name} with find_unused_parameters={find_unused}",
                override=True,
                start_method=start_method,
                find_unused_parameters=find_unused,
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
