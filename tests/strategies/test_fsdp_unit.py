"""fsdp_ncclx / fsdp2_ncclx without processes: names, Lightning's CPU check, barriers, settings."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import lightning_ncclx  # noqa: F401
from lightning_ncclx.errors import ConfigError
from lightning_ncclx.strategies import FSDP2NcclxStrategy, FSDPNcclxStrategy, registered_pytorch_strategies


def test_both_classes_are_registered_with_lightning() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    assert FSDPNcclxStrategy in registered_pytorch_strategies()
    assert FSDP2NcclxStrategy in registered_pytorch_strategies()
    assert StrategyRegistry["fsdp_ncclx"]["strategy"] is FSDPNcclxStrategy
    assert StrategyRegistry["fsdp2_ncclx"]["strategy"] is FSDP2NcclxStrategy


def test_fsdp_names_live_in_their_own_list_not_in_fsdpstrategys() -> None:
    from lightning.pytorch.strategies import FSDPStrategy

    assert FSDPNcclxStrategy._registered_strategies == ["fsdp_ncclx"]
    assert "fsdp_ncclx" not in FSDPStrategy._registered_strategies


@pytest.mark.parametrize(("name", "cls"), [("fsdp_ncclx", FSDPNcclxStrategy), ("fsdp2_ncclx", FSDP2NcclxStrategy)])
def test_trainer_accepts_the_name_on_cpu(name: str, cls: type) -> None:
    from lightning.pytorch import Trainer

    trainer = Trainer(strategy=name, accelerator="cpu", devices=2, logger=False, enable_progress_bar=False)
    assert type(trainer.strategy) is cls


def test_pytorch_lightning_flavour_registers_the_fsdp_names() -> None:
    from pytorch_lightning.strategies import StrategyRegistry

    import lightning_ncclx.strategies.pytorch_lightning as pl_flavour

    assert StrategyRegistry["fsdp_ncclx"]["strategy"] is pl_flavour.PLFSDPNcclxStrategy
    assert StrategyRegistry["fsdp2_ncclx"]["strategy"] is pl_flavour.PLFSDP2NcclxStrategy
    assert pl_flavour.PLFSDP2NcclxStrategy(ncclx={"backend": "gloo"})._tensor_parallel_size == 1


@pytest.mark.parametrize("cls", [FSDPNcclxStrategy, FSDP2NcclxStrategy])
def test_start_up_timeout_comes_from_the_config(cls: type) -> None:
    strategy = cls(ncclx={"timeouts": {"init_timeout_seconds": 1200, "training_timeout_seconds": 600}})
    assert strategy._timeout.total_seconds() == 1200


def test_bad_ncclx_setting_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"ncclx.flight_recorder.buffer_size=-1"):
        FSDPNcclxStrategy(ncclx={"flight_recorder": {"buffer_size": -1}})


@pytest.mark.parametrize(
    ("device", "backend", "expected"),
    [
        (torch.device("cuda", 3), "nccl2", {"device_ids": [3]}),
        (torch.device("cuda", 1), "nccl-lazy", {"device_ids": [1]}),
        (torch.device("cuda", 0), "nccl", {"device_ids": [0]}),
        (torch.device("cpu"), "gloo", {}),
    ],
)
@pytest.mark.parametrize("cls", [FSDPNcclxStrategy, FSDP2NcclxStrategy])
def test_barrier_passes_device_ids_for_every_nccl_backend(cls: type, device, backend: str, expected: dict) -> None:
    strategy = cls()
    with mock.patch.object(cls, "root_device", new_callable=mock.PropertyMock, return_value=device), \
            mock.patch("torch.distributed.is_initialized", return_value=True), \
            mock.patch("torch.distributed.get_backend", return_value=backend), \
            mock.patch("torch.distributed.barrier") as barrier:
        strategy.barrier("x")
    barrier.assert_called_once_with(**expected)


@pytest.mark.parametrize(
    ("dp", "tp", "world", "expected"),
    [("auto", 1, 4, (4, 1)), ("auto", 2, 4, (2, 2)), (2, 2, 4, (2, 2)), ("auto", "auto", 4, ("auto", "auto"))],
)
def test_fsdp2_mesh_sizes_default_to_pure_data_parallel(dp, tp, world: int, expected) -> None:
    strategy = FSDP2NcclxStrategy(data_parallel_size=dp, tensor_parallel_size=tp)
    strategy.parallel_devices = [torch.device("cpu")] * world
    strategy._ncclx_resolve_mesh_sizes()
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == expected


def test_fsdp2_refuses_a_tensor_parallel_size_that_does_not_divide_the_world() -> None:
    strategy = FSDP2NcclxStrategy(tensor_parallel_size=3)
    strategy.parallel_devices = [torch.device("cpu")] * 4
    with pytest.raises(ConfigError, match="tensor_parallel_size=3 does not divide the world size 4"):
        strategy._ncclx_resolve_mesh_sizes()


def test_fsdp_on_cpu_hands_fsdp_the_cpu_device() -> None:
    strategy = FSDPNcclxStrategy(sharding_strategy="SHARD_GRAD_OP")
    strategy.parallel_devices = [torch.device("cpu")]
    kwargs = strategy._ncclx_cpu_fsdp_kwargs()
    assert kwargs["device_id"] == torch.device("cpu")
    assert kwargs["use_orig_params"] is True
