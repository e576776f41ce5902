"""The same strategies for the standalone ``pytorch_lightning`` package (a separate registry
and class hierarchy from ``lightning.pytorch``). FSDP on CPU is supported by the
``lightning.pytorch`` flavour only."""

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Union

import torch
from lightning_fabric.plugins import CheckpointIO, ClusterEnvironment
from pytorch_lightning.accelerators import Accelerator
from pytorch_lightning.plugins.precision import Precision
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

from lightning_ncclx.config import NcclxConfig
from lightning_ncclx.strategies.mixin import NcclxStrategyMixin
from lightning_ncclx.strategies.names import register_ddp_names, register_fsdp2_names, register_fsdp_names
from lightning_ncclx.strategies.sharded import DeviceMeshOnRootDevice, NcclFamilyBarrier, PureDataParallelByDefault

if TYPE_CHECKING:  # as in pytorch_lightning.strategies.fsdp, whose annotations these mirror
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp.fully_sharded_data_parallel import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    _POLICY = Union[set[type[torch.nn.Module]], Callable[[torch.nn.Module, bool, int], bool], ModuleWrapPolicy]
    _SHARDING_STRATEGY = Union[ShardingStrategy, Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]]


class PLDDPNcclxStrategy(NcclxStrategyMixin, DDPStrategy):
    """``ddp_ncclx`` for ``pytorch_lightning.Trainer`` (arguments as ``lightning_ncclx.strategies.ddp``)."""

    strategy_name = "ddp_ncclx"

    def __init__(
        self,
        accelerator: Optional[Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        ddp_comm_state: Optional[object] = None,
        ddp_comm_hook: Optional[Callable] = None,
        ddp_comm_wrapper: Optional[Callable] = None,
        model_averaging_period: Optional[int] = None,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = None,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        *,
        ncclx: Optional[NcclxConfig] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            model_averaging_period=model_averaging_period,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            ncclx=ncclx,
            **kwargs,
        )

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._ncclx_barrier(self.determine_ddp_device_ids())

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_ddp_names(cls, strategy_registry)


class PLFSDPNcclxStrategy(DeviceMeshOnRootDevice, NcclFamilyBarrier, NcclxStrategyMixin, FSDPStrategy):
    """``fsdp_ncclx`` for ``pytorch_lightning.Trainer`` (see ``lightning_ncclx.strategies.fsdp``)."""

    strategy_name = "fsdp_ncclx"
    _registered_strategies: list[str] = []  # not FSDPStrategy's shared list: that one is refused on CPU

    def __init__(
        self,
        accelerator: Optional[Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = None,
        cpu_offload: Union[bool, "CPUOffload", None] = None,
        mixed_precision: Optional["MixedPrecision"] = None,
        auto_wrap_policy: Optional["_POLICY"] = None,
        activation_checkpointing: Optional[Union[type[torch.nn.Module], list[type[torch.nn.Module]]]] = None,
        activation_checkpointing_policy: Optional["_POLICY"] = None,
        sharding_strategy: "_SHARDING_STRATEGY" = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        device_mesh: Union[tuple[int, int], "DeviceMesh", None] = None,
        *,
        ncclx: Optional[NcclxConfig] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            cpu_offload=cpu_offload,
            mixed_precision=mixed_precision,
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing=activation_checkpointing,
            activation_checkpointing_policy=activation_checkpointing_policy,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            device_mesh=device_mesh,
            ncclx=ncclx,
            **kwargs,
        )

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_fsdp_names(cls, strategy_registry)


class PLFSDP2NcclxStrategy(PureDataParallelByDefault, NcclFamilyBarrier, NcclxStrategyMixin, ModelParallelStrategy):
    """``fsdp2_ncclx`` for ``pytorch_lightning.Trainer`` (see ``lightning_ncclx.strategies.fsdp2``)."""

    strategy_name = "fsdp2_ncclx"

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_fsdp2_names(cls, strategy_registry)


def registered_pl_strategies() -> list[type]:
    return [PLDDPNcclxStrategy, PLFSDPNcclxStrategy, PLFSDP2NcclxStrategy]
