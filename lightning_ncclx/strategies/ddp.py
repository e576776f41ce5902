"""``ddp_ncclx``: Lightning's DDP on the configured NCCL backend (gloo on CPU), with the flight
recorder set, two-phase timeouts and the stall watchdog.

Example::

    import lightning_ncclx
    trainer = Trainer(strategy="ddp_ncclx", accelerator="cpu", devices=2)
    # or with explicit settings:
    from lightning_ncclx.strategies import DDPNcclxStrategy
    from lightning_ncclx.config import NcclxConfig
    trainer = Trainer(strategy=DDPNcclxStrategy(ncclx=NcclxConfig(backend="nccl2")), devices=8)
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_ncclx.strategies.mixin import NcclxStrategyMixin
from lightning_ncclx.strategies.names import register_ddp_names


class DDPNcclxStrategy(NcclxStrategyMixin, DDPStrategy):
    """DDP with lightning-ncclx's backend choice, flight recorder, timeouts and stall watchdog."""

    strategy_name = "ddp_ncclx"

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._ncclx_barrier(self.determine_ddp_device_ids())

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_ddp_names(cls, strategy_registry)


from lightning_ncclx.registration import retry_pending  # noqa: E402

retry_pending()
