"""``fsdp_ncclx``: Lightning's FSDPStrategy (FSDP1, ``FullyShardedDataParallel``) on the configured
NCCL backend (gloo on CPU), with the flight recorder set, two-phase timeouts and the stall watchdog.

Example::

    import lightning_ncclx
    trainer = Trainer(strategy="fsdp_ncclx", accelerator="cuda", devices=8, precision="bf16-mixed")
    # explicit settings, or CPU (gloo):
    from lightning_ncclx.strategies import FSDPNcclxStrategy
    trainer = Trainer(strategy=FSDPNcclxStrategy(ncclx={"backend": "nccl2"}, sharding_strategy="HYBRID_SHARD",
                                                 device_mesh=(2, 8)), devices=8, num_nodes=2)

Differences from ``FSDPStrategy``: it runs on CPU too (Lightning refuses names it lists in
``FSDPStrategy._registered_strategies`` without a GPU, so this class keeps its own list, and
FSDP is given ``device_id=torch.device("cpu")`` where Lightning passes ``None``, which FSDP
refuses on a machine without an accelerator), a
``device_mesh`` tuple is built on the root device's type instead of always ``"cuda"``, and the
barrier passes ``device_ids`` for every NCCL-family backend, not only the exact string ``"nccl"``.
"""

from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Generator, Literal, Optional, Union

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import FSDPStrategy
from typing_extensions import override

from lightning_ncclx.config import NcclxConfig

if TYPE_CHECKING:  # as in lightning.pytorch.strategies.fsdp, whose annotations these mirror
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp.fully_sharded_data_parallel import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    _POLICY = Union[set[type[torch.nn.Module]], Callable[[torch.nn.Module, bool, int], bool], ModuleWrapPolicy]
    _SHARDING_STRATEGY = Union[ShardingStrategy, Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]]

from lightning_ncclx.strategies.mixin import NcclxStrategyMixin
from lightning_ncclx.strategies.names import register_fsdp_names
from lightning_ncclx.strategies.sharded import DeviceMeshOnRootDevice, NcclFamilyBarrier


class FSDPNcclxStrategy(DeviceMeshOnRootDevice, NcclFamilyBarrier, NcclxStrategyMixin, FSDPStrategy):
    """FSDP with lightning-ncclx's backend choice, flight recorder, timeouts and stall watchdog.

    Takes every ``FSDPStrategy`` argument (``sharding_strategy``, ``auto_wrap_policy``,
    ``activation_checkpointing_policy``, ``cpu_offload``, ``state_dict_type``, ``device_mesh``...)
    plus ``ncclx=`` (an ``NcclxConfig``, a mapping or a DictConfig). ``timeout`` and
    ``process_group_backend`` are folded into ``ncclx`` as for ``DDPNcclxStrategy`` (see there).
    """

    strategy_name = "fsdp_ncclx"

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
    # FSDPStrategy's class-level list is shared with subclasses, and Lightning refuses every name
    # in it on CPU: the ncclx names live in a list of their own.
    _registered_strategies: list[str] = []

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        if self.root_device.type != "cpu":
            with super().model_sharded_context():
                yield
            return
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import enable_wrap

        with enable_wrap(wrapper_cls=FullyShardedDataParallel, **self._ncclx_cpu_fsdp_kwargs()):
            yield

    @override
    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if self.root_device.type != "cpu" or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)  # GPU, or already wrapped: Lightning's path needs no device id
        from lightning.fabric.strategies.fsdp import _setup_activation_checkpointing

        model = FullyShardedDataParallel(module=model, **self._ncclx_cpu_fsdp_kwargs())
        _setup_activation_checkpointing(model, self._activation_checkpointing_kwargs)
        return model

    def _ncclx_cpu_fsdp_kwargs(self) -> dict[str, Any]:
        """What Lightning passes to FSDP, with ``device_id=cpu`` instead of the CPU device's ``None``."""
        return dict(
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_fsdp_names(cls, strategy_registry)
