"""Behaviour the sharded strategies (fsdp_ncclx, fsdp2_ncclx) share across Lightning flavours
(``lightning.pytorch`` and ``pytorch_lightning``). No Lightning import here: each flavour mixes
these in before ``NcclxStrategyMixin`` and its own base class."""

from datetime import timedelta
from typing import Any, Literal, Optional, Union

from lightning_ncclx.config import NcclxConfig
from lightning_ncclx.errors import ConfigError


def cuda_device_ids(device: Any) -> list[int] | None:
    return [device.index] if device.type == "cuda" and device.index is not None else None


class NcclFamilyBarrier:
    """``barrier(device_ids=...)`` for every NCCL-family backend, not only the exact ``"nccl"``."""

    def barrier(self, name: str | None = None) -> None:
        self._ncclx_barrier(cuda_device_ids(self.root_device))  # type: ignore[attr-defined]


class DeviceMeshOnRootDevice:
    """FSDPStrategy builds a ``device_mesh`` tuple with ``init_device_mesh("cuda", ...)``, wrong
    on CPU: build it on the root device's type once the process group exists."""

    def setup_environment(self) -> None:
        kwargs = self.kwargs  # type: ignore[attr-defined]
        mesh_shape = kwargs.get("device_mesh")
        if isinstance(mesh_shape, tuple):
            del kwargs["device_mesh"]
        super().setup_environment()  # type: ignore[misc]
        if isinstance(mesh_shape, tuple):
            from torch.distributed.device_mesh import init_device_mesh

            kwargs["device_mesh"] = init_device_mesh(self.root_device.type, mesh_shape)  # type: ignore[attr-defined]


class PureDataParallelByDefault:
    """ModelParallelStrategy with ``data_parallel_size="auto"`` and an explicit
    ``tensor_parallel_size``: data-parallel size = world size / tensor-parallel size."""

    def __init__(
        self,
        data_parallel_size: Union[Literal["auto"], int] = "auto",
        tensor_parallel_size: Union[Literal["auto"], int] = 1,
        save_distributed_checkpoint: bool = True,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = None,
        *,
        ncclx: Optional[NcclxConfig] = None,
    ) -> None:
        """ModelParallelStrategy's arguments plus ``ncclx``; ``tensor_parallel_size`` defaults to 1
        (FSDP2 only) where Lightning's defaults to ``"auto"``; ``timeout`` and
        ``process_group_backend`` are folded into ``ncclx`` as for ``DDPNcclxStrategy``."""
        super().__init__(  # type: ignore[call-arg]
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
            ncclx=ncclx,
        )

    def setup_environment(self) -> None:
        self._ncclx_resolve_mesh_sizes()
        super().setup_environment()  # type: ignore[misc]

    def _ncclx_resolve_mesh_sizes(self) -> None:
        dp, tp = self._data_parallel_size, self._tensor_parallel_size  # type: ignore[attr-defined]
        if dp != "auto" or tp == "auto":
            return  # explicit sizes, or Lightning's own "auto"/"auto" (one node = one TP group)
        world = self.num_nodes * self.num_processes  # type: ignore[attr-defined]
        if world % tp:
            name = self.strategy_name  # type: ignore[attr-defined]
            raise ConfigError(f"{name}: tensor_parallel_size={tp} does not divide the world size {world}")
        self._data_parallel_size = world // tp
