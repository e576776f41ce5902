"""LightningCLI with a tiny model; every rank writes ``<out>/rank_<r>.json`` with the strategy's
class and ``ncclx`` settings as instantiated from the command line / YAML.

    python cli_job.py fit --out DIR [LightningCLI arguments...]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import lightning_ncclx  # noqa: F401  - registers the strategy names
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class TinyModel(LightningModule):
    def __init__(self, out: Path = Path(".")) -> None:
        super().__init__()
        self.out = Path(out)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_start(self) -> None:
        strategy = self.trainer.strategy
        seen = {
            "strategy_class": type(strategy).__name__,
            "ncclx": dataclasses.asdict(strategy.ncclx),
            "timeout_seconds": strategy._timeout.total_seconds(),
            "backend": strategy._get_process_group_backend(),
            "world_size": self.trainer.world_size,
        }
        (self.out / f"rank_{self.trainer.global_rank}.json").write_text(json.dumps(seen, default=str))


if __name__ == "__main__":
    LightningCLI(TinyModel, save_config_callback=None)
