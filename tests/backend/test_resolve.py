"""Backend choice -> the string init_process_group gets, or a clear refusal."""

from __future__ import annotations

import pytest

from lightning_ncclx.backend.resolve import BackendCapabilities, is_nccl_family, nccl_resolution, probe_capabilities, resolve_backend
from lightning_ncclx.errors import BackendUnavailableError


def caps(**overrides: object) -> BackendCapabilities:
    base = dict(torch_version="2.15.0", has_nccl2=True, has_legacy_name=True, nccl_built=True, gloo_available=True,
                cuda_devices=8, nccl2_by_default=True)
    base.update(overrides)
    return BackendCapabilities(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("choice", "device", "capabilities", "expected"),
    [
        ("auto", "cuda", caps(), "nccl"),
        ("auto", "cpu", caps(cuda_devices=0), "gloo"),
        # auto follows the device Lightning chose, even where torch's own count disagrees
        ("auto", "cuda", caps(cuda_devices=0), "nccl"),
        ("auto", "mps", caps(cuda_devices=0), "gloo"),
        ("nccl2", "cuda", caps(), "nccl2"),
        ("nccl-lazy", "cuda", caps(), "nccl-lazy"),
        ("nccl-legacy", "cuda", caps(), "nccl-legacy"),
        ("nccl-legacy", "cuda", caps(torch_version="2.13.0", has_nccl2=False, has_legacy_name=False), "nccl"),
        ("gloo", "cuda", caps(), "gloo"),
    ],
)
def test_servable_choices(choice: str, device: str, capabilities: BackendCapabilities, expected: str) -> None:
    assert resolve_backend(choice, device, capabilities) == expected


@pytest.mark.parametrize(
    ("choice", "device", "capabilities", "message"),
    [
        ("nccl2", "cpu", caps(cuda_devices=0), r"ncclx.backend='nccl2' needs CUDA devices, but this job runs on 'cpu'"),
        ("nccl2", "cuda", caps(torch_version="2.13.0", has_nccl2=False), r"needs torch >= 2.15 .* torch 2.13.0 is installed"),
        ("nccl-lazy", "cuda", caps(cuda_devices=0), r"needs at least one CUDA device"),
        ("nccl-legacy", "cuda", caps(nccl_built=False), r"built without it"),
        ("gloo", "cpu", caps(gloo_available=False), r"needs gloo"),
        ("auto", "cuda", caps(nccl_built=False), r"'auto' on the CUDA devices Lightning chose needs NCCL, but torch 2.15.0 was built without it"),
    ],
)
def test_unservable_choices_are_refused(choice: str, device: str, capabilities: BackendCapabilities, message: str) -> None:
    with pytest.raises(BackendUnavailableError, match=message):
        resolve_backend(choice, device, capabilities)


def test_nccl_resolution_explains_the_switch() -> None:
    assert "ProcessGroupNCCL2" in nccl_resolution(caps())
    assert "TORCH_DIST_USE_NCCL2=0" in nccl_resolution(caps(nccl2_by_default=False))
    assert "has no nccl2" in nccl_resolution(caps(has_nccl2=False, torch_version="2.13.0"))


def test_probe_on_this_machine_reads_torch_dist_use_nccl2(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", "0")
    probed = probe_capabilities()
    assert not probed.nccl2_by_default
    assert probed.torch_version == torch.__version__.split("+")[0]
    assert probed.gloo_available


def test_real_torch_refuses_nccl2_without_a_gpu() -> None:
    """The message the plugin's refusal replaces: torch's own error on a CPU-only machine."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() or not hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL2"):
        pytest.skip("needs torch >= 2.15 on a machine without CUDA devices")
    with pytest.raises(BackendUnavailableError):
        resolve_backend("nccl2", "cpu", probe_capabilities())


@pytest.mark.parametrize(("name", "expected"), [("nccl", True), ("nccl2", True), ("cuda:nccl-lazy", True), ("gloo", False), (None, False)])
def test_nccl_family(name: str | None, expected: bool) -> None:
    assert is_nccl_family(name) is expected
