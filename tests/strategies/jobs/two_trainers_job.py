"""Two Trainers, one after the other, in one script (fit then a second fit, as in a sweep).

Every rank writes ``<out>/rank_<r>.json``: the environment before the first Trainer and after the
second, and each Trainer's run id and dump folder.

    python two_trainers_job.py --out DIR [--devices 2] [--strategy ddp_ncclx]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning_ncclx  # noqa: F401  - registers the strategy names
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class TinyModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_once(args: argparse.Namespace) -> dict:
    trainer = Trainer(
        strategy=args.strategy, accelerator="cpu", devices=args.devices, max_steps=3, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=args.root,
    )
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
    trainer.fit(TinyModel(), data)
    strategy = trainer.strategy
    return {"run_id": strategy.ncclx_run_id, "dump_dir": str(strategy.ncclx_dump_dir), "rank": trainer.global_rank}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="ddp_ncclx")
    args = parser.parse_args()
    before = dict(os.environ)
    trainers = [fit_once(args), fit_once(args)]
    after = dict(os.environ)
    rank = trainers[0]["rank"]
    (args.out / f"rank_{rank}.json").write_text(json.dumps({"before": before, "after": after, "trainers": trainers}, indent=1))


if __name__ == "__main__":
    main()
