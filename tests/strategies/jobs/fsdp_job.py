"""A tiny FSDP fit on CPU (gloo) that records, on every rank, what lightning-ncclx set up.

Run by tests/strategies/test_fsdp*.py in a subprocess (Lightning's popen launcher re-runs this
script for every rank). Writes ``<out>/rank_<r>.json``.

    python fsdp_job.py --out DIR --strategy fsdp_ncclx|fsdp2_ncclx [--devices 2] [--instance]
        [--ncclx-json '{...}'] [--precision 32-true] [--checkpoint]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import lightning_ncclx  # noqa: F401  - registers the strategy names
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.lin(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class ShardedModel(LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.net = Net()
        self.out = out
        self.seen: dict = {}

    def configure_model(self) -> None:
        from lightning.pytorch.strategies import ModelParallelStrategy

        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for block in self.net.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self.net, mesh=mesh)
        else:  # FSDP1: configure_model runs inside Lightning's enable_wrap context
            from torch.distributed.fsdp.wrap import wrap

            for i, block in enumerate(self.net.blocks):
                self.net.blocks[i] = wrap(block)
            self.net = wrap(self.net)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        if batch_idx == 3:
            self._record()
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def _record(self) -> None:
        from observe import what_this_rank_sees

        self.seen = what_this_rank_sees(self.trainer)
        self.seen.update({
            "param_types": sorted({type(p).__name__ for p in self.parameters()}),
            "wrapped": type(self.net).__name__,
            "mesh": list(self.device_mesh.mesh.shape) if getattr(self, "_device_mesh", None) is not None else None,
        })

    def on_train_end(self) -> None:
        from lightning_ncclx.backend.timeouts import current_timeouts

        self.seen["timeouts_at_end"] = current_timeouts()
        (self.out / f"rank_{self.trainer.global_rank}.json").write_text(json.dumps(self.seen, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--strategy", default="fsdp_ncclx")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--instance", action="store_true", help="pass a strategy instance built from --ncclx-json")
    parser.add_argument("--ncclx-json", default="{}")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--checkpoint", action="store_true", help="save a checkpoint at the end")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    strategy: object = args.strategy
    if args.instance:
        from lightning_ncclx.strategies import FSDP2NcclxStrategy, FSDPNcclxStrategy

        cls = FSDP2NcclxStrategy if args.strategy == "fsdp2_ncclx" else FSDPNcclxStrategy
        strategy = cls(ncclx=json.loads(args.ncclx_json))
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(args.out),
    )
    trainer.fit(ShardedModel(args.out), DataLoader(data, batch_size=4))
    if args.checkpoint:
        trainer.save_checkpoint(args.out / "final.ckpt")


if __name__ == "__main__":
    sys.exit(main())
