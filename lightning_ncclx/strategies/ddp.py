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

from datetime import timedelta
from typing import Any, Callable, Literal, Optional

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_ncclx.config import NcclxConfig

from lightning_ncclx.strategies.mixin import NcclxStrategyMixin
from lightning_ncclx.strategies.names import register_ddp_names


class DDPNcclxStrategy(NcclxStrategyMixin, DDPStrategy):
    """DDP with lightning-ncclx's backend choice, flight recorder, timeouts and stall watchdog.

    Takes every ``DDPStrategy`` argument, plus ``ncclx``:

    Args:
        process_group_backend: ``None``: ``ncclx.backend`` decides (``auto`` = Lightning's choice
            for its device, nccl on CUDA and gloo otherwise). One of ``ncclx.backend``'s names
            (``nccl2``, ``nccl-legacy``, ``nccl-lazy``, ``gloo``) sets ``ncclx.backend``; any other
            name (``"nccl"``, ``"mpi"``, ``"cpu:gloo,cuda:nccl"``...) goes to torch unchecked, as
            with Lightning, with the flight-recorder variables and watchdog still set.
        timeout: ``None``: ``ncclx.timeouts`` decide. Otherwise the start-up timeout
            (``ncclx.timeouts.init_timeout_seconds``: group creation and the first ``warmup_steps``
            batches); the training timeout becomes ``min(ncclx.timeouts.training_timeout_seconds,
            timeout)``, and default stall thresholds that would not fire before it are halved.
        ncclx: an ``NcclxConfig``, a mapping or a DictConfig.
    """

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

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._ncclx_barrier(self.determine_ddp_device_ids())

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_ddp_names(cls, strategy_registry)
