"""ddp_ncclx without processes: Lightning's "nccl"-only special cases applied to every NCCL-family
choice (barrier device ids, atexit destroy), and what it refuses."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from lightning_ncclx.strategies import DDPNcclxStrategy


@pytest.mark.parametrize(
    ("device", "backend", "expected"),
    [
        (torch.device("cuda", 3), "nccl2", {"device_ids": [3]}),
        (torch.device("cuda", 1), "nccl-lazy", {"device_ids": [1]}),
        (torch.device("cuda", 2), "nccl-legacy", {"device_ids": [2]}),
        (torch.device("cuda", 0), "nccl", {"device_ids": [0]}),
        (torch.device("cpu"), "gloo", {}),
    ],
)
def test_barrier_passes_device_ids_for_every_nccl_backend(device: torch.device, backend: str, expected: dict) -> None:
    strategy = DDPNcclxStrategy()
    with mock.patch.object(DDPNcclxStrategy, "root_device", new_callable=mock.PropertyMock, return_value=device), \
            mock.patch("torch.distributed.is_initialized", return_value=True), \
            mock.patch("torch.distributed.get_backend", return_value=backend), \
            mock.patch("torch.distributed.barrier") as barrier:
        strategy.barrier()
    barrier.assert_called_once_with(**expected)


@pytest.mark.parametrize(("backend", "registers"), [("nccl2", True), ("nccl-lazy", True), ("nccl-legacy", True),
                                                    ("nccl", False), ("gloo", False)])
def test_atexit_destroy_for_nccl_backends_lightning_does_not_cover(backend: str, registers: bool) -> None:
    """Lightning registers its atexit destroy for the exact string "nccl" only."""
    strategy = DDPNcclxStrategy()
    strategy._ncclx_backend = backend
    with mock.patch("atexit.register") as register, mock.patch.object(DDPNcclxStrategy, "global_rank", 1):
        strategy._ncclx_after_group()
    assert register.called is registers


def test_start_up_timeout_comes_from_the_config() -> None:
    strategy = DDPNcclxStrategy(ncclx={"timeouts": {"init_timeout_seconds": 1234, "training_timeout_seconds": 60},
                                       "watchdog": {"train_step_seconds": 30, "validation_seconds": 30,
                                                    "checkpoint_seconds": 30, "auto": {"floor_seconds": 10}}})
    assert strategy._timeout.total_seconds() == 1234
