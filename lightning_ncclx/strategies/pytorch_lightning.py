"""The same strategies for the standalone ``pytorch_lightning`` package (a separate registry
and class hierarchy from ``lightning.pytorch``)."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

from lightning_ncclx.errors import ConfigError
from lightning_ncclx.strategies.mixin import NcclxStrategyMixin
from lightning_ncclx.strategies.names import register_ddp_names


def _cuda_device_ids(strategy: Any) -> list[int] | None:
    device = strategy.root_device
    return [device.index] if device.type == "cuda" and device.index is not None else None


class PLDDPNcclxStrategy(NcclxStrategyMixin, DDPStrategy):
    """``ddp_ncclx`` for ``pytorch_lightning.Trainer``."""

    strategy_name = "ddp_ncclx"

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._ncclx_barrier(self.determine_ddp_device_ids())

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_ddp_names(cls, strategy_registry)


class PLFSDPNcclxStrategy(NcclxStrategyMixin, FSDPStrategy):
    """``fsdp_ncclx`` for ``pytorch_lightning.Trainer`` (see ``lightning_ncclx.strategies.fsdp``)."""

    strategy_name = "fsdp_ncclx"
    _registered_strategies: list[str] = []  # not FSDPStrategy's shared list: that one is refused on CPU

    def setup_environment(self) -> None:
        mesh_shape = self.kwargs.get("device_mesh")
        if isinstance(mesh_shape, tuple):
            del self.kwargs["device_mesh"]
        super().setup_environment()
        if isinstance(mesh_shape, tuple):
            from torch.distributed.device_mesh import init_device_mesh

            self.kwargs["device_mesh"] = init_device_mesh(self.root_device.type, mesh_shape)

    def barrier(self, name: str | None = None) -> None:
        self._ncclx_barrier(_cuda_device_ids(self))

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_fsdp_names(cls, strategy_registry)


class PLFSDP2NcclxStrategy(NcclxStrategyMixin, ModelParallelStrategy):
    """``fsdp2_ncclx`` for ``pytorch_lightning.Trainer`` (see ``lightning_ncclx.strategies.fsdp2``)."""

    strategy_name = "fsdp2_ncclx"

    def __init__(self, data_parallel_size: Any = "auto", tensor_parallel_size: Any = 1,
                 save_distributed_checkpoint: bool = True, *, ncclx: Any = None, **kwargs: Any) -> None:
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size,
                         save_distributed_checkpoint=save_distributed_checkpoint, ncclx=ncclx, **kwargs)

    def setup_environment(self) -> None:
        dp, tp = self._data_parallel_size, self._tensor_parallel_size
        if dp == "auto" and tp != "auto":
            world = self.num_nodes * self.num_processes
            if world % tp:
                raise ConfigError(f"fsdp2_ncclx: tensor_parallel_size={tp} does not divide the world size {world}")
            self._data_parallel_size = world // tp
        super().setup_environment()

    def barrier(self, name: str | None = None) -> None:
        self._ncclx_barrier(_cuda_device_ids(self))

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_fsdp2_names(cls, strategy_registry)


def register_fsdp_names(cls: Any, strategy_registry: Any) -> None:
    strategy_registry.register("fsdp_ncclx", cls, override=True,
                               description="FSDP on torch's NCCL backends with flight recorder and stall watchdog")
    if "fsdp_ncclx" not in cls._registered_strategies:
        cls._registered_strategies.append("fsdp_ncclx")


def register_fsdp2_names(cls: Any, strategy_registry: Any) -> None:
    strategy_registry.register("fsdp2_ncclx", cls, override=True,
                               description="FSDP2 (fully_shard) on torch's NCCL backends with flight recorder and stall watchdog")


def registered_pl_strategies() -> list[type]:
    return [PLDDPNcclxStrategy, PLFSDPNcclxStrategy, PLFSDP2NcclxStrategy]


from lightning_ncclx.registration import retry_pending  # noqa: E402

retry_pending()
