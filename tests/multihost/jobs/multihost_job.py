"""A small multi-node Lightning job on ``ddp_ncclx`` (gloo on CPU) with an injectable fault.

Started once per rank by an external launcher (torchrun, or by hand with SLURM's variables):
Lightning picks TorchElasticEnvironment or SLURMEnvironment by itself; nothing here launches.

    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=N --master_addr=A --master_port=P \\
        multihost_job.py --num-nodes 2 --devices 2 --dump-dir '$NODE_DUMPS/ncclx' --fault stuck_train --fault-rank 3

``--dump-dir`` is kept as given (``$VARS`` included): every rank expands it in its own environment
(``ncclx.flight_recorder.dump_dir`` is expanded by lightning-ncclx), so each node can point at its
own local disk with one command line. Faults (on global rank ``--fault-rank`` at batch
``--at-batch``): ``none``, ``stuck_train`` (sleeps in training_step), ``skip_collective`` (skips an
all_reduce of a sub-group the others enter).

``--slow-node N --slow-node-threshold T``: ranks on node ``N`` use a train-step threshold of ``T``
seconds, so the other node's ranks notice a stall first (and summarize there).
``--progress-dir D``: every rank touches ``D/rank_<r>.batch_<i>`` at each batch (the tests wait on it).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import lightning_ncclx  # noqa: F401 - registers the strategy names
from lightning.pytorch import LightningModule, Trainer

FOREVER = 3600.0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--dump-dir", required=True)
    p.add_argument("--fault", default="none", choices=("none", "stuck_train", "skip_collective"))
    p.add_argument("--fault-rank", type=int, default=3)
    p.add_argument("--at-batch", type=int, default=3)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds each training step sleeps")
    p.add_argument("--train-step-seconds", type=float, default=4.0)
    p.add_argument("--first-step-seconds", type=float, default=30.0)
    p.add_argument("--slow-node", type=int, default=None)
    p.add_argument("--slow-node-threshold", type=float, default=60.0)
    p.add_argument("--collect-timeout", type=float, default=15.0)
    p.add_argument("--no-gather", action="store_true")
    p.add_argument("--progress-dir", default=None)
    return p.parse_args()


def node_rank() -> int:
    env = os.environ
    return int(env.get("GROUP_RANK", env.get("NODE_RANK", env.get("SLURM_NODEID", "0"))))


class Data(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(4)


class Model(LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(4, 1)
        self.sub = None

    def setup(self, stage: str) -> None:
        self.sub = dist.new_group(backend="gloo")  # the faults hit this group: a clean hang under gloo

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        a, r = self.args, dist.get_rank()
        if a.progress_dir:
            Path(os.path.expandvars(a.progress_dir), f"rank_{r}.batch_{batch_idx}").touch()
        faulty = r == a.fault_rank and batch_idx == a.at_batch
        if a.step_sleep:
            time.sleep(a.step_sleep)
        if faulty and a.fault == "stuck_train":
            time.sleep(FOREVER)
        t = torch.ones(3)
        if not (faulty and a.fault == "skip_collective"):
            dist.all_reduce(t, group=self.sub)
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    args = parse()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {socket.gethostname()} %(name)s %(levelname)s %(message)s")
    from lightning_ncclx.config import (AutoThresholdConfig, FlightRecorderConfig, NcclxConfig, StallAction,
                                        TimeoutConfig, WatchdogConfig)
    from lightning_ncclx.strategies import DDPNcclxStrategy

    step = args.train_step_seconds
    if args.slow_node is not None and node_rank() == args.slow_node:
        step = args.slow_node_threshold
    watchdog = WatchdogConfig(
        poll_interval_seconds=0.25, first_step_seconds=max(args.first_step_seconds, step), train_step_seconds=step,
        validation_seconds=60.0, checkpoint_seconds=60.0, collect_timeout_seconds=args.collect_timeout,
        on_stall=StallAction.dump_and_exit, max_dumps_per_run=1, gather_through_store=not args.no_gather,
        auto=AutoThresholdConfig(enabled=False),
    )
    strategy = DDPNcclxStrategy(ncclx=NcclxConfig(
        backend="gloo", watchdog=watchdog, flight_recorder=FlightRecorderConfig(dump_dir=args.dump_dir),
        timeouts=TimeoutConfig(init_timeout_seconds=300.0, training_timeout_seconds=180.0, warmup_steps=1)))
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy=strategy, max_epochs=1,
        limit_train_batches=args.batches, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        default_root_dir=os.path.expandvars(args.dump_dir),
    )
    print(f"job: host={socket.gethostname()} node_rank={node_rank()} global_rank={trainer.global_rank} "
          f"environment={type(trainer.strategy.cluster_environment).__name__}", file=sys.stderr, flush=True)
    trainer.fit(Model(args), DataLoader(Data(), batch_size=1, shuffle=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
