"""A 4-rank Lightning fit on CPU with sleep-based steps, for the straggler tests.

    python straggler_job.py --fault slow_compute --fault-rank 2 --root-dir /tmp/r [--attach callback]

Every training step sleeps ``--step-ms`` (the rank's "compute"). Faults: ``none``;
``slow_compute`` (``--fault-rank`` sleeps ``--slow-fraction`` more in training_step);
``slow_loader`` (its dataset sleeps ``--slow-fraction`` x step-ms per item); ``noisy`` (every
rank's step is ``step-ms`` x uniform(1 - noise, 1 + noise), independently per rank and step).

``--attach``: ``callback`` adds ``StragglerDetector`` to stock ``ddp``; ``strategy`` uses
``--strategy`` (``ddp_ncclx``, ``fsdp_ncclx`` or ``fsdp2_ncclx``, which attach it); ``none``
imports nothing from lightning_ncclx (zero-code adoption through the entry point and
``LIGHTNING_NCCLX_WATCH``). ``--fault-rank`` takes a comma-separated list (several slow ranks).
With ``--attach strategy``, ``$NCCLX_TEST_ALERTS`` (JSON) is the strategy's ``ncclx.alerts``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="none", choices=["none", "slow_compute", "slow_loader", "noisy"])
    p.add_argument("--fault-rank", type=lambda text: [int(r) for r in text.split(",")], default=[2])
    p.add_argument("--slow-fraction", type=float, default=0.3)
    p.add_argument("--noise", type=float, default=0.2)
    p.add_argument("--step-ms", type=float, default=100.0)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--interval-steps", type=int, default=10)
    p.add_argument("--intervals", type=int, default=6)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--attach", default="callback", choices=["callback", "strategy", "none"])
    p.add_argument("--strategy", default="ddp_ncclx", choices=["ddp_ncclx", "fsdp_ncclx", "fsdp2_ncclx"],
                   help="with --attach strategy")
    p.add_argument("--root-dir", required=True)
    return p.parse_args()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


class Data(Dataset):
    def __init__(self, args: argparse.Namespace, n: int) -> None:
        self.args, self.n = args, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        a = self.args
        if a.fault == "slow_loader" and local_rank() in a.fault_rank:
            time.sleep(a.slow_fraction * a.step_ms / 1e3)
        return torch.randn(4)


class Model(LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(4, 1)
        self.noise = random.Random(1000 + local_rank())

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        a = self.args
        seconds = a.step_ms / 1e3
        if a.fault == "slow_compute" and local_rank() in a.fault_rank:
            seconds *= 1.0 + a.slow_fraction
        if a.fault == "noisy":
            seconds *= self.noise.uniform(1.0 - a.noise, 1.0 + a.noise)
        time.sleep(seconds)
        return self.layer(batch).sum()

    def configure_model(self) -> None:
        from lightning.pytorch.strategies import ModelParallelStrategy

        if isinstance(self.trainer.strategy, ModelParallelStrategy):  # FSDP2 shards here; others need nothing
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    args = parse()
    torch.set_num_threads(1)
    batches = args.interval_steps * args.intervals
    settings = {"interval_steps": args.interval_steps, "patience": args.patience, "poll_interval_seconds": 0.2}
    callbacks: list = []
    strategy: object = "ddp"
    if args.attach == "callback":
        from lightning_ncclx.config import StragglerConfig
        from lightning_ncclx.straggler import StragglerDetector

        callbacks.append(StragglerDetector(StragglerConfig(**settings)))
    elif args.attach == "strategy":
        from lightning_ncclx import strategies

        cls = {"ddp_ncclx": strategies.DDPNcclxStrategy, "fsdp_ncclx": strategies.FSDPNcclxStrategy,
               "fsdp2_ncclx": strategies.FSDP2NcclxStrategy}[args.strategy]
        ncclx = {"backend": "gloo", "straggler": settings, "flight_recorder": {"buffer_size": 2000}}
        if os.environ.get("NCCLX_TEST_ALERTS"):
            import json

            ncclx["alerts"] = json.loads(os.environ["NCCLX_TEST_ALERTS"])
        strategy = cls(ncclx=ncclx)
    trainer = Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=1,
                      limit_train_batches=batches, limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, default_root_dir=args.root_dir,
                      logger=CSVLogger(os.path.join(args.root_dir, "logs"), name="job"))
    if trainer.global_rank == 0:
        print(f"callbacks: {sorted(type(c).__name__ for c in trainer.callbacks)}", flush=True)
        print(f"lightning_ncclx imported before fit: {'lightning_ncclx' in sys.modules}", flush=True)
    trainer.fit(Model(args), DataLoader(Data(args, batches * args.devices + 8), batch_size=1))
    if trainer.global_rank == 0:
        print(f"callbacks after fit: {sorted(type(c).__name__ for c in trainer.callbacks)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
