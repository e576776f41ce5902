"""``ddp_ncclx`` for Lightning Fabric: backend choice, flight recorder and start-up timeout.

Fabric has no callbacks and no batch hooks, so the stall watchdog and the switch to the
training timeout are not automatic there: call ``strategy.ncclx_training_started()`` once the
first steps have run to apply ``ncclx.timeouts.training_timeout_seconds`` on every rank.

Example::

    import lightning_ncclx
    fabric = Fabric(strategy="ddp_ncclx", accelerator="cpu", devices=2)
"""

from datetime import timedelta
from typing import Any, Literal, Optional

import torch
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment, Precision
from lightning.fabric.strategies import DDPStrategy
from typing_extensions import override

from lightning_ncclx.config import NcclxConfig

from lightning_ncclx.backend.timeouts import apply_timeout_to_all_groups
from lightning_ncclx.strategies.names import register_ddp_names
from lightning_ncclx.strategies.mixin import NcclxStrategyMixin


class FabricDDPNcclxStrategy(NcclxStrategyMixin, DDPStrategy):
    """Fabric's DDP with lightning-ncclx's backend choice, flight recorder and timeouts.

    Takes every argument of Fabric's ``DDPStrategy`` plus ``ncclx``; ``timeout`` and
    ``process_group_backend`` are folded into ``ncclx`` as for ``DDPNcclxStrategy``."""

    strategy_name = "ddp_ncclx"
    attaches_watchdog = False

    def __init__(
        self,
        accelerator: Optional[Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision: Optional[Precision] = None,
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
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            ncclx=ncclx,
            **kwargs,
        )

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._ncclx_barrier(self._determine_ddp_device_ids())

    def ncclx_training_started(self) -> None:
        """Apply the training timeout on every process group (call on all ranks together)."""
        schedule = self._ncclx_schedule
        if schedule is not None and not schedule.switched:
            schedule.switched = True
            apply_timeout_to_all_groups(schedule.training_timeout, self.barrier)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_ddp_names(cls, strategy_registry)
