"""One Lightning fit for bench_overhead.py: a small MLP on CPU, step times measured on rank 0.

    python overhead_job.py --out FILE --strategy {ddp,ddp_ncclx} --devices N --buffer-size B --steps S [--straggler-interval K]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class StepTimer(Callback):
    """Wall time between consecutive batch starts: the whole step (forward, backward, all-reduce,
    optimizer, every callback hook including the watchdog heartbeats)."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.starts.append(time.perf_counter())


class SmallModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                       torch.nn.ReLU(), torch.nn.Linear(512, 1))

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--buffer-size", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--straggler-interval", type=int, default=0, help="0: straggler detection off")
    parser.add_argument("--no-doorbell", action="store_true", help="watchdog.event_doorbell false (poll the store)")
    parser.add_argument("--no-watchdog", action="store_true", help="watchdog.enabled false (recorder only)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    strategy: object = args.strategy
    if args.strategy == "ddp_ncclx":
        from lightning_ncclx.strategies import DDPNcclxStrategy

        straggler = {"enabled": args.straggler_interval > 0, "interval_steps": max(2, args.straggler_interval)}
        strategy = DDPNcclxStrategy(ncclx={"flight_recorder": {"buffer_size": args.buffer_size}, "watchdog": {"enabled": not args.no_watchdog, "event_doorbell": not args.no_doorbell},
                                           "straggler": straggler})
    else:
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.buffer_size)
    timer = StepTimer()
    data = TensorDataset(torch.randn(args.steps * 8, 256), torch.randn(args.steps * 8, 1))
    trainer = Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_steps=args.steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[timer], default_root_dir=str(args.out.parent))
    trainer.fit(SmallModel(), DataLoader(data, batch_size=8))
    if trainer.global_rank == 0:
        steps = [b - a for a, b in zip(timer.starts, timer.starts[1:])][args.warmup:]
        args.out.write_text(json.dumps({"median_s": statistics.median(steps), "mean_s": statistics.fmean(steps), "n": len(steps),
                                        "callbacks": [type(c).__name__ for c in trainer.callbacks]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
