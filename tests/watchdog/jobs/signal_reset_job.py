"""A real Lightning fit (ddp_ncclx on gloo, world size ``--devices``) whose on-demand signal is
taken from the watchdog by native code after set-up, as a native library would, then sent.

    python signal_reset_job.py --mode libc_reset --dump-dir /tmp/d

Modes (the change at training step 2, ``kill -USR2`` to itself at step 4 unless said):
``libc_reset`` (libc's ``signal(SIGUSR2, SIG_DFL)`` through ctypes: the action that ends the
process), ``libc_reset_in_a_stuck_step`` (the same, then the kill 1 s later in the same step, no
step boundary in between: only the watchdog thread can undo it), ``c10_handler_removed`` (c10's
fatal-signal handler, a native SIGUSR2 handler, is on before the Trainer starts and switched off
at batch 2, which puts back the SIG_DFL it found), ``none`` (no signal: trains until an
on-demand event of the dump folder has its summary, for ``lightning-ncclx dump``).

Every mode trains on until an ``ondemand-*`` folder has its summary, then stops (at most
``--max-seconds``). Exit 0 is a survived signal; -12 a process the signal ended.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

import lightning_ncclx  # noqa: F401 - registers the strategy names
from lightning_ncclx.config import FlightRecorderConfig, NcclxConfig, StallAction, WatchdogConfig
from lightning_ncclx.strategies import DDPNcclxStrategy

RESET_AT, KILL_AT = 2, 4


def reset_to_default_in_c() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGUSR2, 0)  # SIG_DFL, behind Python's back


class Model(LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(8, 8)
        self.started = time.monotonic()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        mode = self.args.mode
        step = self.global_step  # batch_idx starts again every epoch: each change happens once
        if step == RESET_AT and mode in ("libc_reset", "libc_reset_in_a_stuck_step"):
            reset_to_default_in_c()
            print("native reset done", flush=True)
        if step == RESET_AT and mode == "c10_handler_removed":
            torch._C._set_print_stack_traces_on_fatal_signal(False)
            print("native handler removed", flush=True)
        if step == RESET_AT and mode == "libc_reset_in_a_stuck_step":
            time.sleep(1.0)  # the watchdog thread polls every 0.2 s meanwhile
            os.kill(os.getpid(), signal.SIGUSR2)
            print("signal sent", flush=True)
        if step == KILL_AT and mode in ("libc_reset", "c10_handler_removed"):
            os.kill(os.getpid(), signal.SIGUSR2)  # as `kill -USR2 <pid>` would
            print("signal sent", flush=True)
        time.sleep(self.args.step_seconds)
        done = any((folder / "summary.json").exists() for folder in Path(self.args.dump_dir).rglob("ondemand-*"))
        stop = torch.tensor([float(done or time.monotonic() - self.started > self.args.max_seconds)])
        if dist.is_initialized():
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if stop.item() > 0:
            self.trainer.should_stop = True
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="none")
    p.add_argument("--dump-dir", required=True, help="where the job's dumps go: given as dump_dir, or the Trainer's "
                   "default_root_dir with --run-dir (then <it>/ncclx_dumps/<run id>)")
    p.add_argument("--run-dir", action="store_true")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--max-seconds", type=float, default=90.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    if args.mode == "c10_handler_removed":
        torch._C._set_print_stack_traces_on_fatal_signal(True)
    watchdog = WatchdogConfig(poll_interval_seconds=0.2, train_step_seconds=60.0, on_stall=StallAction.dump)
    recorder = FlightRecorderConfig() if args.run_dir else FlightRecorderConfig(dump_dir=args.dump_dir)
    strategy = DDPNcclxStrategy(ncclx=NcclxConfig(backend="gloo", watchdog=watchdog, flight_recorder=recorder))
    trainer = Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=-1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=args.dump_dir)
    data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4)
    trainer.fit(Model(args), data)
    print(f"fit ended, SIGUSR2 action {signal.getsignal(signal.SIGUSR2)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
