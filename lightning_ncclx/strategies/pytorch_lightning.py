"""The same strategies for the standalone ``pytorch_lightning`` package (a separate registry
and class hierarchy from ``lightning.pytorch``)."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.strategies import DDPStrategy

from lightning_ncclx.strategies.names import register_ddp_names
from lightning_ncclx.strategies.mixin import NcclxStrategyMixin


class PLDDPNcclxStrategy(NcclxStrategyMixin, DDPStrategy):
    """``ddp_ncclx`` for ``pytorch_lightning.Trainer``."""

    strategy_name = "ddp_ncclx"

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._ncclx_barrier(self.determine_ddp_device_ids())

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_ddp_names(cls, strategy_registry)


def registered_pl_strategies() -> list[type]:
    return [PLDDPNcclxStrategy]


from lightning_ncclx.registration import retry_pending  # noqa: E402

retry_pending()
