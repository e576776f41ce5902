"""``watchdog/loop_phases.py``: the phase every hook of the user and of the module runs in, whatever
the callback order, in a real (single-process) Lightning fit: the watchdog listed after the user's
callbacks, a user ``Checkpoint`` callback that Lightning moves last, module-only hooks that run
before any callback hook. (The same hooks sleeping, computing and waiting in barriers on real
3-rank jobs: ``test_consensus_jobs.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, Checkpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_ncclx.config import WatchdogConfig
from lightning_ncclx.watchdog import StallWatchdog
from lightning_ncclx.watchdog.activity import main_thread_site

SEEN: list[tuple[str, str]] = []
SITES: dict[str, str | None] = {}


def _record(watchdog: StallWatchdog, where: str) -> None:
    runtime = watchdog.runtime
    SEEN.append((where, runtime.heartbeat.last.phase.value if runtime is not None else "-"))


class UserCallback(Callback):
    def __init__(self, watchdog: StallWatchdog) -> None:
        self.watchdog = watchdog

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        _record(self.watchdog, "callback.on_train_epoch_start")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        _record(self.watchdog, "callback.on_train_batch_start")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        _record(self.watchdog, "callback.on_train_epoch_end")
        SITES["callback"] = main_thread_site()

    def on_validation_start(self, trainer, pl_module) -> None:
        _record(self.watchdog, "callback.on_validation_start")

    def on_validation_end(self, trainer, pl_module) -> None:
        _record(self.watchdog, "callback.on_validation_end")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        _record(self.watchdog, "callback.on_save_checkpoint")


class UserCheckpoint(Checkpoint):
    """Lightning moves every Checkpoint after the other callbacks; this one saves at validation end."""

    def __init__(self, watchdog: StallWatchdog, folder: Path) -> None:
        self.watchdog, self.folder = watchdog, folder

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        _record(self.watchdog, "checkpoint.on_validation_end")
        trainer.save_checkpoint(self.folder / f"epoch{trainer.current_epoch}.ckpt")
        _record(self.watchdog, "checkpoint.after_save")


class Model(LightningModule):
    def __init__(self, watchdog: StallWatchdog) -> None:
        super().__init__()
        self.watchdog = watchdog
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        _record(self.watchdog, "module.training_step")
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        pass

    def on_validation_model_eval(self) -> None:  # a module-only hook, before any callback hook
        super().on_validation_model_eval()
        _record(self.watchdog, "module.on_validation_model_eval")

    def on_validation_end(self) -> None:
        _record(self.watchdog, "module.on_validation_end")
        SITES["module"] = main_thread_site()

    def on_train_epoch_end(self) -> None:
        _record(self.watchdog, "module.on_train_epoch_end")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture
def fit(tmp_path: Path):
    SEEN.clear()
    SITES.clear()
    watchdog = StallWatchdog(WatchdogConfig(poll_interval_seconds=0.05), dump_dir=tmp_path / "dumps")
    callbacks = [UserCheckpoint(watchdog, tmp_path), UserCallback(watchdog), watchdog]  # the watchdog last
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    trainer = Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=1, num_sanity_val_steps=1,
                      callbacks=callbacks, logger=False, enable_progress_bar=False, enable_checkpointing=True,
                      enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path)
    assert trainer.callbacks.index(watchdog) < len(trainer.callbacks) - 1  # Lightning moved the checkpoint last
    trainer.fit(Model(watchdog), data, data)
    return trainer


def _phases(where: str) -> set[str]:
    return {phase for name, phase in SEEN if name == where}


def test_epoch_end_and_validation_hooks_run_in_validation_whatever_the_callback_order(fit) -> None:
    for where in ("callback.on_train_epoch_end", "module.on_train_epoch_end", "callback.on_validation_start",
                  "module.on_validation_model_eval", "callback.on_validation_end", "module.on_validation_end",
                  "checkpoint.on_validation_end", "checkpoint.after_save"):
        assert _phases(where) == {"validation"}, (where, SEEN)


def test_checkpoint_hooks_run_in_checkpoint_and_batches_in_train_step(fit) -> None:
    assert _phases("callback.on_save_checkpoint") == {"checkpoint"}
    # a hook listed before the watchdog's on_train_batch_start still sees the phase before the batch
    assert _phases("callback.on_train_batch_start") == {"setup", "epoch_start", "train_step"}
    assert _phases("module.training_step") == {"first_step", "train_step"}
    starts = [phase for name, phase in SEEN if name == "callback.on_train_epoch_start"]
    assert starts == ["setup", "epoch_start"]


def test_the_wrappers_are_gone_after_fit(fit) -> None:
    for obj in (fit, fit.fit_loop, fit.fit_loop.epoch_loop.val_loop, fit.validate_loop, fit.test_loop,
                fit.predict_loop):
        assert not [name for name, value in vars(obj).items() if getattr(value, "_ncclx_watched", False)], obj


def test_the_site_of_a_hook_names_it_and_the_users_line(fit) -> None:
    """What the consensus learns a recovered wait by: stable across epochs."""
    assert SITES["callback"].startswith("Callback.on_train_epoch_end of UserCallback at ")
    assert SITES["module"].startswith("LightningModule.on_validation_end of Model at ")
    assert "test_loop_phases.py:" in SITES["callback"] and " in on_train_epoch_end" in SITES["callback"]
