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

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy
from typing_extensions import override

from lightning_ncclx.strategies.mixin import NcclxStrategyMixin
from lightning_ncclx.strategies.names import register_fsdp2_names
from lightning_ncclx.strategies.sharded import NcclFamilyBarrier, PureDataParallelByDefault


class FSDP2NcclxStrategy(PureDataParallelByDefault, NcclFamilyBarrier, NcclxStrategyMixin, ModelParallelStrategy):
    """FSDP2 / 2D parallelism with lightning-ncclx's backend, recorder, timeouts and watchdog.

    Args:
        data_parallel_size: ranks per data-parallel (FSDP) group; ``"auto"``: world size divided
            by ``tensor_parallel_size``.
        tensor_parallel_size: ranks per tensor-parallel group (default 1: FSDP2 only); ``"auto"``
            keeps Lightning's meaning (the processes of one node).
        save_distributed_checkpoint: one checkpoint shard per rank (True) or one full file (False).
        process_group_backend: folded into ``ncclx.backend`` as for ``DDPNcclxStrategy``.
        timeout: the start-up timeout, folded into ``ncclx.timeouts`` as for ``DDPNcclxStrategy``.
        ncclx: an ``NcclxConfig``, a mapping or a DictConfig.
    """

    strategy_name = "fsdp2_ncclx"

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        register_fsdp2_names(cls, strategy_registry)
