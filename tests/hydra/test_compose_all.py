"""Every config option composes, and the strategy/model/data it names can be built."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_ncclx.config import NcclxConfig, ncclx_config_from

REPO = Path(__file__).resolve().parents[2]
PACKAGED = REPO / "lightning_ncclx" / "conf"


def options(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


STRATEGIES = options(PACKAGED / "strategy")
TRAINERS = options(REPO / "conf" / "trainer")
EXPERIMENTS = options(REPO / "conf" / "experiment")
FAULTS = options(REPO / "conf" / "fault")
MODELS = options(REPO / "conf" / "model")
CLASSES = {"ddp_ncclx": "DDPNcclxStrategy", "fsdp_ncclx": "FSDPNcclxStrategy", "fsdp2_ncclx": "FSDP2NcclxStrategy"}


def test_the_option_lists_are_what_the_docs_promise() -> None:
    assert STRATEGIES == ["ddp_ncclx", "fsdp2_ncclx", "fsdp_ncclx"]
    assert TRAINERS == ["cpu", "ddp_sim", "default", "gpu"]
    assert FAULTS == ["skip_collective", "stuck", "wrong_op"]
    assert len(EXPERIMENTS) >= 4


@pytest.mark.parametrize("app", ["train_fsdp", "train_ddp"])
def test_every_strategy_trainer_combination_composes_and_builds_its_strategy(compose, app: str) -> None:
    from hydra.utils import instantiate

    for strategy, trainer in itertools.product(STRATEGIES, TRAINERS):
        cfg = compose(app, [f"strategy={strategy}", f"trainer={trainer}"])
        built = instantiate(cfg.trainer.strategy)
        assert type(built).__name__ == CLASSES[strategy], (strategy, trainer)
        assert built.ncclx == ncclx_config_from(cfg.ncclx)
        assert cfg.trainer._target_ == "lightning.pytorch.Trainer"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_builds_strategy_model_and_data(compose, experiment: str) -> None:
    from hydra.utils import instantiate

    cfg = compose("train_fsdp", [f"experiment={experiment}"])
    strategy = instantiate(cfg.trainer.strategy)
    assert type(strategy).__name__ in CLASSES.values()
    model = instantiate(cfg.model)
    data = instantiate(cfg.data)
    assert data.vocab_size == model.hparams.vocab_size and data.seq_len == model.hparams.seq_len


def test_experiment_presets_start_with_the_command_that_runs_them() -> None:
    for path in sorted((REPO / "conf" / "experiment").glob("*.yaml")) + sorted((REPO / "conf" / "fault").glob("*.yaml")):
        lines = path.read_text().splitlines()
        assert lines[0] == "# @package _global_", path
        assert lines[1].startswith("# python examples/"), path


@pytest.mark.parametrize("model", MODELS)
def test_every_model_builds_and_runs_a_forward(compose, model: str) -> None:
    import torch
    from hydra.utils import instantiate

    cfg = compose("train_ddp", [f"model={model}", "model.activation_checkpointing=true"])
    module = instantiate(cfg.model)
    data = instantiate(cfg.data)
    data.setup("fit")
    x, y = next(iter(data.train_dataloader()))
    logits = module(x)
    assert logits.shape == (*x.shape, cfg.model.vocab_size)
    assert module.model.lm_head.weight is module.model.tok_emb.weight, "weights are not tied"
    torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1)).backward()


@pytest.mark.parametrize("fault", FAULTS)
def test_every_fault_preset_composes_a_valid_config_that_ends_the_run_on_a_stall(compose, fault: str) -> None:
    from faults import FaultInjector

    cfg = compose("train_fsdp", ["trainer=ddp_sim", f"+fault={fault}", "fault.rank=2", "fault.step=4"])
    ncclx = ncclx_config_from(cfg.ncclx)
    assert ncclx.watchdog.on_stall.value == "dump_and_exit"
    assert ncclx.watchdog.train_step_seconds <= 10
    injector = FaultInjector(**OmegaConf.to_container(cfg.fault))
    assert (injector.kind, injector.rank, injector.step) == (fault, 2, 4)
    assert cfg.callbacks.checkpoint is None


def test_the_packaged_ncclx_default_takes_every_value_from_the_schema(compose) -> None:
    """Defaults are written once (config.py); the YAML holds the defaults list and comments."""
    yaml = OmegaConf.load(PACKAGED / "ncclx" / "default.yaml")
    assert list(yaml) == ["defaults"] and list(yaml.defaults) == ["ncclx_schema", "_self_"]
    cfg = compose("train_fsdp", [])
    expected = OmegaConf.to_container(OmegaConf.structured(NcclxConfig), enum_to_str=True)
    assert OmegaConf.to_container(cfg.ncclx, resolve=True, enum_to_str=True) == expected  # the app sets none


def test_every_key_of_the_schema_is_explained_in_the_packaged_yaml() -> None:
    text = (PACKAGED / "ncclx" / "default.yaml").read_text()
    flat = OmegaConf.to_container(OmegaConf.structured(NcclxConfig), enum_to_str=True)
    missing = [key for key in _dotted_keys(flat) if f"#   {key}" not in text]
    assert missing == []


def _dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        if isinstance(value, dict) and key != "exit_codes":
            keys += _dotted_keys(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys
