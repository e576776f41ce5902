"""The ncclx strategies take every argument of their Lightning parents: the same signatures, and
``timeout``/``process_group_backend`` folded into ``ncclx``."""

from __future__ import annotations

import inspect
import re
import typing
from datetime import timedelta

import pytest
from lightning.fabric.strategies import DDPStrategy as FabricDDPStrategy
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
from pytorch_lightning.strategies import DDPStrategy as PLDDPStrategy
from pytorch_lightning.strategies import FSDPStrategy as PLFSDPStrategy
from pytorch_lightning.strategies import ModelParallelStrategy as PLModelParallelStrategy

from lightning_ncclx.errors import ConfigError
from lightning_ncclx.strategies import DDPNcclxStrategy, FSDP2NcclxStrategy, FSDPNcclxStrategy
from lightning_ncclx.strategies.fabric import FabricDDPNcclxStrategy
from lightning_ncclx.strategies.pytorch_lightning import PLDDPNcclxStrategy, PLFSDP2NcclxStrategy, PLFSDPNcclxStrategy

PAIRS = [
    (DDPNcclxStrategy, DDPStrategy),
    (FSDPNcclxStrategy, FSDPStrategy),
    (FSDP2NcclxStrategy, ModelParallelStrategy),
    (FabricDDPNcclxStrategy, FabricDDPStrategy),
    (PLDDPNcclxStrategy, PLDDPStrategy),
    (PLFSDPNcclxStrategy, PLFSDPStrategy),
    (PLFSDP2NcclxStrategy, PLModelParallelStrategy),
]
# The only by-design differences (README "Drop-in: differences from Lightning's strategies").
OWN_DEFAULTS = {"timeout": None, "tensor_parallel_size": 1}


def _type_names(cls: type, name: str) -> set[str]:
    """The names an annotation is made of, without module paths and Optional/None (Lightning and
    lightning-ncclx spell the same types through different imports, resolved or as text)."""
    raw = inspect.signature(cls.__init__).parameters[name].annotation
    text = raw if isinstance(raw, str) else getattr(raw, "__name__", None) if isinstance(raw, type) else repr(raw)
    return set(re.findall(r"([A-Za-z_]\w*)(?![\w.])", text)) - {"Optional", "Union", "None", "NoneType", "ForwardRef"}


@pytest.mark.parametrize(("ours", "lightnings"), PAIRS, ids=lambda c: f"{c.__module__.split('.')[0]}.{c.__name__}")
def test_signature_mirrors_the_lightning_parent(ours: type, lightnings: type) -> None:
    mine = dict(inspect.signature(ours.__init__).parameters)
    theirs = dict(inspect.signature(lightnings.__init__).parameters)
    ncclx = mine.pop("ncclx")
    assert ncclx.kind is inspect.Parameter.KEYWORD_ONLY and ncclx.default is None
    assert list(mine) == list(theirs), "parameters added, removed or reordered in Lightning: update the signature"
    for name, parameter in theirs.items():
        assert mine[name].kind == parameter.kind, name
        assert mine[name].default == OWN_DEFAULTS.get(name, parameter.default), name
        if name not in ("self", "kwargs"):
            assert _type_names(ours, name) == _type_names(lightnings, name), name


@pytest.mark.parametrize("cls", [DDPNcclxStrategy, FSDPNcclxStrategy, FSDP2NcclxStrategy, FabricDDPNcclxStrategy])
def test_lightning_timeout_is_the_start_up_timeout_and_caps_the_training_one(cls: type) -> None:
    strategy = cls(timeout=timedelta(seconds=900))
    assert strategy._timeout == timedelta(seconds=900)
    assert strategy.ncclx.timeouts.init_timeout_seconds == 900
    assert strategy.ncclx.timeouts.training_timeout_seconds == 600  # already shorter: kept
    short = cls(timeout=timedelta(seconds=30))
    assert short.ncclx.timeouts.training_timeout_seconds == 30
    watchdog = short.ncclx.watchdog
    assert (watchdog.first_step_seconds, watchdog.train_step_seconds) == (15, 15), "default thresholds race the timeout"
    assert watchdog.auto.floor_seconds <= watchdog.train_step_seconds


def test_timeout_and_the_ncclx_start_up_timeout_must_agree() -> None:
    with pytest.raises(ConfigError, match=r"DDPNcclxStrategy\(timeout=100 s\) disagrees with ncclx.timeouts.init_timeout_seconds=1200"):
        DDPNcclxStrategy(timeout=timedelta(seconds=100), ncclx={"timeouts": {"init_timeout_seconds": 1200}})
    DDPNcclxStrategy(timeout=timedelta(seconds=1200), ncclx={"timeouts": {"init_timeout_seconds": 1200}})


def test_a_threshold_the_user_set_is_not_lowered_silently() -> None:
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.train_step_seconds=250 must be shorter than ncclx.timeouts.training_timeout_seconds=200"):
        DDPNcclxStrategy(timeout=timedelta(seconds=200), ncclx={"watchdog": {"train_step_seconds": 250}})


@pytest.mark.parametrize(
    ("argument", "backend", "passthrough"),
    [("gloo", "gloo", None), ("nccl2", "nccl2", None), ("auto", "auto", None), ("nccl", "auto", "nccl"), ("mpi", "auto", "mpi"),
     ("cpu:gloo,cuda:nccl", "auto", "cpu:gloo,cuda:nccl")],
)
def test_process_group_backend_sets_ncclx_backend_or_passes_through(argument: str, backend: str, passthrough: str | None) -> None:
    strategy = DDPNcclxStrategy(process_group_backend=argument)
    assert strategy.ncclx.backend == backend
    assert strategy._ncclx_passthrough_backend == passthrough
    if passthrough is not None:
        assert strategy._get_process_group_backend() == passthrough


def test_process_group_backend_and_ncclx_backend_must_agree() -> None:
    with pytest.raises(ConfigError, match=r"FSDPNcclxStrategy\(process_group_backend='gloo'\) disagrees with ncclx.backend='nccl2'"):
        FSDPNcclxStrategy(process_group_backend="gloo", ncclx={"backend": "nccl2"})


def test_constructor_signature_types_resolve() -> None:
    """LightningCLI (jsonargparse) resolves these annotations: they must name importable types."""
    for ours, _ in PAIRS:
        hints = typing.get_type_hints(ours.__init__, include_extras=False, localns={"_POLICY": object,
                                                                                   "_SHARDING_STRATEGY": object,
                                                                                   "CPUOffload": object,
                                                                                   "MixedPrecision": object,
                                                                                   "DeviceMesh": object})
        assert "ncclx" in hints


def test_auto_follows_the_device_lightning_chose() -> None:
    import torch
    from unittest import mock

    from lightning_ncclx.backend.resolve import BackendCapabilities

    caps = BackendCapabilities(torch_version="2.15.0", has_nccl2=True, has_legacy_name=True, nccl_built=True,
                               gloo_available=True, cuda_devices=0, nccl2_by_default=True)
    strategy = DDPNcclxStrategy(parallel_devices=[torch.device("cuda", 0)])
    with mock.patch("lightning_ncclx.strategies.mixin.probe_capabilities", return_value=caps):
        assert strategy._get_process_group_backend() == "nccl"
    assert DDPNcclxStrategy(parallel_devices=[torch.device("cpu")])._get_process_group_backend() == "gloo"


@pytest.mark.parametrize(
    ("name", "start_method", "find_unused"),
    [("ddp_ncclx_fork", "fork", None), ("ddp_ncclx_notebook", "fork", None),
     ("ddp_ncclx_find_unused_parameters_true", "popen", True), ("ddp_ncclx_spawn_find_unused_parameters_false", "spawn", False)],
)
def test_lightnings_ddp_name_variants_exist_for_ddp_ncclx(name: str, start_method: str, find_unused: bool | None) -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    entry = StrategyRegistry[name]
    assert entry["strategy"] is DDPNcclxStrategy
    assert entry["init_params"].get("start_method") == start_method
    assert entry["init_params"].get("find_unused_parameters") == find_unused
    strategy = StrategyRegistry.get(name)
    assert isinstance(strategy, DDPNcclxStrategy) and strategy._start_method == start_method
