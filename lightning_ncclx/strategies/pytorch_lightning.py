"""The same strategies for the standalone ``pytorch_lightning`` package (a separate registry
and class hierarchy from ``lightning.pytorch``). FSDP on CPU is supported by the
``lightning.pytorch`` flavour only."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

from lightning_ncclx.strategies.mixin import NcclxStrategyMixin
from lightning_ncclx.strategies.names import register_ddp_names, register_fsdp2_names, register_fsdp_names
from lightning_ncclx.strategies.sharded import DeviceMeshOnRootDevice, NcclFamilyBarrier, PureDataParallelByDefault


class PLDDPNcclxStrategy(NcclxStrategyMixin, DDPStrategy):
    """``ddp_ncclx`` for ``pytorch_lightning.Trainer``."""

    strategy_name = "ddp_ncclx"

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._ncclx_barrier(self.determine_ddp_device_ids())

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_ddp_names(cls, strategy_registry)


class PLFSDPNcclxStrategy(DeviceMeshOnRootDevice, NcclFamilyBarrier, NcclxStrategyMixin, FSDPStrategy):
    """``fsdp_ncclx`` for ``pytorch_lightning.Trainer`` (see ``lightning_ncclx.strategies.fsdp``)."""

    strategy_name = "fsdp_ncclx"
    _registered_strategies: list[str] = []  # not FSDPStrategy's shared list: that one is refused on CPU

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


from lightning_ncclx.registration import retry_pending  # noqa: E402

retry_pending()
