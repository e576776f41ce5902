"""``backend/serving.py``: what serves each device of a live process group (a real 1-rank gloo
group), and how the NCCL version torch links is reported (a tuple joined with dots, an old
integer as is, a library that cannot be loaded as None)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lightning_ncclx.backend.serving import nccl_version, serving_implementations


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


def test_nccl_version_is_dotted_when_torch_has_nccl() -> None:
    version = nccl_version()
    if not dist.is_nccl_available():
        assert version is None
    else:
        assert version is not None and re.fullmatch(r"\d+\.\d+\.\d+(\.\w+)?", version), version


@pytest.mark.parametrize(("reported", "expected"), [((2, 21, 5), "2.21.5"), (21805, "21805")])
def test_nccl_version_formats_a_tuple_or_an_old_integer(monkeypatch: pytest.MonkeyPatch, reported, expected) -> None:
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: reported)
    assert nccl_version() == expected


def test_a_libnccl_that_fails_to_load_is_no_version_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> tuple[int, ...]:
        raise OSError("libnccl.so.2: cannot open shared object file")

    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", broken)
    assert nccl_version() is None
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (9, 9, 9))
    assert nccl_version() is None  # no NCCL in this torch: its version is not asked
