"""Real Trainers in this process (one rank, gloo): what ddp_ncclx sets is taken back at teardown,
each Trainer has its own run id and folder, and no empty folder is left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

import lightning_ncclx  # noqa: F401  - registers the strategy names
from lightning_ncclx.layout import RUN_ID_VARIABLE


class TinyModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SeeEnvironment(Callback):
    def __init__(self) -> None:
        self.during: dict[str, str] = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.during = dict(os.environ)


def data() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)


def fit(strategy: Any, root: Path, test_too: bool = False) -> tuple[Trainer, SeeEnvironment]:
    seen = SeeEnvironment()
    trainer = Trainer(
        strategy=strategy, accelerator="cpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, callbacks=[seen],
    )
    model = TinyModel()
    trainer.fit(model, data())
    if test_too:
        trainer.test(model, data())
    return trainer, seen


def environment_change(before: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    after = dict(os.environ)
    return {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


@pytest.fixture
def clean_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("TORCH_FR_", "TORCH_NCCL_", "LIGHTNING_NCCLX", "SLURM_", "TORCHELASTIC_")) or name in (
            "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK",
        ):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_launcher_environment")
def test_two_trainers_change_the_environment_exactly_as_lightnings_ddp_does(tmp_path: Path) -> None:
    before = dict(os.environ)
    fit("ddp", tmp_path / "stock")
    stock_change = environment_change(before)
    for name in stock_change:  # what Lightning's own launcher leaves behind
        os.environ.pop(name, None) if before.get(name) is None else os.environ.__setitem__(name, before[name])

    first, seen_first = fit("ddp_ncclx", tmp_path / "ncclx")
    second, seen_second = fit("ddp_ncclx", tmp_path / "ncclx")
    assert environment_change(before).keys() == stock_change.keys()
    assert seen_first.during["TORCH_FR_BUFFER_SIZE"] == "20000", "the variables are set while the run lasts"
    assert seen_second.during["TORCH_FR_DUMP_TEMP_FILE"].startswith(str(second.strategy.ncclx_dump_dir))
    assert first.strategy.ncclx_run_id != second.strategy.ncclx_run_id
    assert first.strategy.ncclx_dump_dir != second.strategy.ncclx_dump_dir
    assert RUN_ID_VARIABLE not in os.environ


@pytest.mark.usefixtures("clean_launcher_environment")
def test_a_users_own_values_come_back_after_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "123")
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    _, seen = fit("ddp_ncclx", tmp_path)
    assert (seen.during["TORCH_FR_BUFFER_SIZE"], seen.during["TORCH_NCCL_ENABLE_TIMING"]) == ("20000", "0")
    assert (os.environ["TORCH_FR_BUFFER_SIZE"], os.environ["TORCH_NCCL_ENABLE_TIMING"]) == ("123", "1")


@pytest.mark.usefixtures("clean_launcher_environment")
def test_no_empty_folder_is_left_when_nothing_was_dumped(tmp_path: Path) -> None:
    trainer, _ = fit("ddp_ncclx", tmp_path, test_too=True)
    assert trainer.strategy.ncclx_dump_dir is not None
    assert trainer.strategy.ncclx_dump_dir.parent.parent == tmp_path
    assert not (tmp_path / "ncclx_dumps").exists(), sorted(tmp_path.rglob("*"))


@pytest.mark.usefixtures("clean_launcher_environment")
def test_fit_then_test_on_one_trainer_keeps_one_run_id(tmp_path: Path) -> None:
    seen_ids: list[str | None] = []

    class RecordRunId(Callback):
        def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
            seen_ids.append(trainer.strategy.ncclx_run_id)

    trainer = Trainer(
        strategy="ddp_ncclx", accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, callbacks=[RecordRunId()],
    )
    model = TinyModel()
    trainer.fit(model, data())
    trainer.test(model, data())
    assert len(seen_ids) == 2 and seen_ids[0] == seen_ids[1] is not None


@pytest.mark.usefixtures("clean_launcher_environment")
def test_a_failed_fit_takes_its_variables_back(tmp_path: Path) -> None:
    class Boom(TinyModel):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise RuntimeError("boom")

    before = {k: v for k, v in os.environ.items() if k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    handler_before = signal.getsignal(signal.SIGUSR2)
    trainer = Trainer(strategy="ddp_ncclx", accelerator="cpu", devices=1, max_steps=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom(), data())
    assert {k: v for k, v in os.environ.items() if k.startswith(("TORCH_FR_", "TORCH_NCCL_"))} == before
    # Lightning puts back the handlers it saved after setup, the watchdog's among them: it must not come back
    assert signal.getsignal(signal.SIGUSR2) is handler_before
