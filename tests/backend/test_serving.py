"""``backend/serving.py``: what serves each device of a live process group (a real 1-rank gloo
group)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_ncclx.backend.serving import serving_implementations


@pytest.fixture
def gloo_world(tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_no_process_group_means_nothing_is_served() -> None:
    assert not dist.is_initialized()
    assert serving_implementations() == {}


def test_each_device_of_the_world_group_names_the_backend_and_its_class(gloo_world) -> None:
    served = serving_implementations()
    assert served["cpu"] == "gloo (ProcessGroupGloo)"
    # CUDA builds of torch register gloo for cuda too, even on a machine without a GPU
    assert set(served) <= {"cpu", "cuda"} and set(served.values()) == {"gloo (ProcessGroupGloo)"}


def test_a_given_group_is_described_instead_of_the_world(gloo_world) -> None:
    sub = dist.new_group([0], backend="gloo", group_desc="sub")
    assert serving_implementations(sub)["cpu"] == "gloo (ProcessGroupGloo)"
