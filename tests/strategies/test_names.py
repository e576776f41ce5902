"""``strategies/names.py``: the names registered in a fresh, real Lightning strategy registry -
the four DDP names with Lightning's ``find_unused_parameters`` variants, their start methods and
descriptions, re-registration allowed, and the FSDP name added once to the class's CPU refusal
list. (The names in Lightning's global registry: ``tests/strategies/test_lightning_arguments.py``
and ``tests/strategies/test_fsdp_unit.py``.)"""

from __future__ import annotations

from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

from lightning_ncclx.strategies.names import register_ddp_names, register_fsdp2_names, register_fsdp_names


class MyDDP(DDPStrategy):
    pass


def test_four_ddp_names_each_with_two_find_unused_variants() -> None:
    registry = _StrategyRegistry()
    register_ddp_names(MyDDP, registry)
    assert sorted(registry) == sorted(
        [base + suffix for base in ("ddp_ncclx", "ddp_ncclx_spawn", "ddp_ncclx_fork", "ddp_ncclx_notebook")
         for suffix in ("", "_find_unused_parameters_false", "_find_unused_parameters_true")])
    assert {entry["strategy"] for entry in registry.values()} == {MyDDP}


def test_start_methods_and_find_unused_parameters_per_name() -> None:
    registry = _StrategyRegistry()
    register_ddp_names(MyDDP, registry)
    params = {name: entry["init_params"] for name, entry in registry.items()}
    assert params["ddp_ncclx"] == {"start_method": "popen"}
    assert params["ddp_ncclx_spawn"] == {"start_method": "spawn"}
    assert params["ddp_ncclx_notebook"] == {"start_method": "fork"}  # as Lightning's ddp_notebook
    assert params["ddp_ncclx_fork_find_unused_parameters_true"] == {"start_method": "fork", "find_unused_parameters": True}
    assert params["ddp_ncclx_find_unused_parameters_false"] == {"start_method": "popen", "find_unused_parameters": False}


def test_descriptions_say_what_each_name_is() -> None:
    registry = _StrategyRegistry()
    register_ddp_names(MyDDP, registry)
    assert registry["ddp_ncclx_spawn"]["description"] == (
        "DDP on torch's NCCL backends with flight recorder and stall watchdog (spawn)")
    assert registry["ddp_ncclx_spawn_find_unused_parameters_true"]["description"] == (
        "ddp_ncclx_spawn with find_unused_parameters=True")


def test_registering_again_replaces_the_entries_instead_of_failing() -> None:
    registry = _StrategyRegistry()
    register_ddp_names(DDPStrategy, registry)
    register_ddp_names(MyDDP, registry)
    assert registry["ddp_ncclx"]["strategy"] is MyDDP and len(registry) == 12


def test_fsdp_name_is_added_once_to_the_classes_own_cpu_refusal_list() -> None:
    class MyFSDP(FSDPStrategy):
        _registered_strategies: list[str] = ["something_else"]

    registry = _StrategyRegistry()
    register_fsdp_names(MyFSDP, registry)
    register_fsdp_names(MyFSDP, registry)
    assert list(registry) == ["fsdp_ncclx"] and registry["fsdp_ncclx"]["strategy"] is MyFSDP
    assert registry["fsdp_ncclx"]["init_params"] == {}
    assert MyFSDP._registered_strategies == ["something_else", "fsdp_ncclx"]


def test_fsdp2_name() -> None:
    class MyFSDP2(ModelParallelStrategy):
        pass

    registry = _StrategyRegistry()
    register_fsdp2_names(MyFSDP2, registry)
    register_fsdp2_names(MyFSDP2, registry)
    assert list(registry) == ["fsdp2_ncclx"] and registry["fsdp2_ncclx"]["strategy"] is MyFSDP2
    assert registry["fsdp2_ncclx"]["description"].startswith("FSDP2 (fully_shard) on torch's NCCL backends")
