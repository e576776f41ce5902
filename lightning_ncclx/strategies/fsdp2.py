"""``fsdp2_ncclx``: Lightning's ModelParallelStrategy (FSDP2, ``fully_shard``; optionally with
tensor parallelism) on the configured NCCL backend (gloo on CPU), with the flight recorder set,
two-phase timeouts and the stall watchdog.

The LightningModule applies ``fully_shard`` in ``configure_model`` on
``self.device_mesh["data_parallel"]``, as with ``ModelParallelStrategy``.

Example::

    import lightning_ncclx
    trainer = Trainer(strategy="fsdp2_ncclx", accelerator="cuda", devices=8, precision="bf16-mixed")

Differences from ``ModelParallelStrategy``: the default is pure data parallelism
(``tensor_parallel_size=1``, ``data_parallel_size="auto"`` = world size / tensor_parallel_size),
the device mesh is built on the root device's type (``cpu`` with gloo, ``cuda`` with the NCCL
backends), and the barrier passes ``device_ids`` for every NCCL-family backend.
"""

from __future__ import annotations

from typing import Any, Literal

from lightning.pytorch.strategies import ModelParallelStrategy
from typing_extensions import override

from lightning_ncclx.config import NcclxConfig
from lightning_ncclx.errors import ConfigError
from lightning_ncclx.strategies.mixin import NcclxStrategyMixin

FSDP2_NAMES = ("fsdp2_ncclx",)


class FSDP2NcclxStrategy(NcclxStrategyMixin, ModelParallelStrategy):
    """FSDP2 / 2D parallelism with lightning-ncclx's backend, recorder, timeouts and watchdog.

    Args:
        data_parallel_size: ranks per data-parallel (FSDP) group; ``"auto"``: world size divided
            by ``tensor_parallel_size``.
        tensor_parallel_size: ranks per tensor-parallel group (default 1: FSDP2 only); ``"auto"``
            keeps Lightning's meaning (the processes of one node).
        save_distributed_checkpoint: one checkpoint shard per rank (True) or one full file (False).
        ncclx: an ``NcclxConfig``, a mapping or a DictConfig.
    """

    strategy_name = "fsdp2_ncclx"

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = 1,
        save_distributed_checkpoint: bool = True,
        *,
        ncclx: NcclxConfig | Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            ncclx=ncclx,
            **kwargs,
        )

    @override
    def setup_environment(self) -> None:
        self._ncclx_resolve_mesh_sizes()
        super().setup_environment()

    def _ncclx_resolve_mesh_sizes(self) -> None:
        dp, tp = self._data_parallel_size, self._tensor_parallel_size
        if dp != "auto" or tp == "auto":
            return  # explicit sizes, or Lightning's own "auto"/"auto" (one node = one TP group)
        world = self.num_nodes * self.num_processes
        if world % tp:
            raise ConfigError(
                f"{self.strategy_name}: tensor_parallel_size={tp} does not divide the world size {world}"
            )
        self._data_parallel_size = world // tp

    @override
    def barrier(self, name: str | None = None) -> None:
        device = self.root_device
        self._ncclx_barrier([device.index] if device.type == "cuda" and device.index is not None else None)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_fsdp2_names(cls, strategy_registry)


def register_fsdp2_names(cls: Any, strategy_registry: Any) -> None:
    for name in FSDP2_NAMES:
        strategy_registry.register(
            name,
            cls,
            description="FSDP2 (fully_shard) on torch's NCCL backends with flight recorder and stall watchdog",
            override=True,
        )


from lightning_ncclx.registration import retry_pending  # noqa: E402

retry_pending()
