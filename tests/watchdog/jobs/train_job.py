"""A tiny multi-rank Lightning job with an injectable fault, run by the watchdog tests.

Run as a script (Lightning's ``ddp`` launcher re-runs it once per extra rank)::

    python train_job.py --fault stuck_train --fault-rank 1 --at-batch 2 --dump-dir /tmp/d

Faults (on rank ``--fault-rank`` at training batch ``--at-batch``): ``none``, ``skip_collective``
(skips an all_reduce on a sub-group), ``skip_world_collective`` (skips an all_reduce on the default
group, which DDP's gradient all_reduce then meets), ``other_collective`` (all_gather where the others
all_reduce), ``dtype_mismatch`` / ``half_dtype_mismatch`` (the step's all_reduce of 3 doubles / 3 halves
where the others all_reduce 3 floats: gloo aborts the rank with the smaller buffer), ``stuck_train`` (sleeps in training_step), ``signal_then_stuck`` (SIGUSR2 to itself, then
sleeps in the same training_step), ``stuck_loader`` (sleeps in the dataset),
``raise`` (RuntimeError in training_step), ``stuck_pipeline`` (every step each rank receives from the rank before
and sends to the next on a gloo group; the fault rank gets stuck before its send), ``pipeline_wrong_peer`` (the same pipeline; the fault rank sends to the rank before instead of the next), ``pipeline_skip_send`` (the same pipeline; the fault rank skips one send and goes on), ``die`` (SIGKILLs itself), ``freeze`` (SIGSTOPs
itself), ``hang_at_exit`` (every rank hangs in an atexit handler after a healthy fit), ``hold_gil`` (a regex that holds the GIL for hours: its watchdog thread cannot run), ``bigger_all_reduce`` (an all_reduce of 8 floats on the sub-group where the others all_reduce 3: gloo aborts the rank before it in the ring, rank 0 and the store it hosts for fault rank 1 of 3), ``stuck_epoch_end`` (sleeps in on_train_epoch_end
while the others all_reduce there), ``healthy_slow`` (slow first step, slow steps, a long
validation batch, a slow checkpoint and a slow start of the second epoch's loader: no alarm
expected), ``slow_state_dict`` (every 3 steps a checkpoint whose ``state_dict()`` takes 4.5 s, as
gathering a big model does, before any checkpoint hook runs: no alarm expected).

Healthy jobs for the consensus detector (no alarm expected; steps of ``--step-sleep``):
``slow_rank`` (the fault rank's steps take 1.5x, and every rank's loader is uneven as below),
``uneven_loader`` (every rank's batches take a random 0-1x ``--step-sleep`` to load), ``slow_val_sync`` (at the validation after ``--at-batch``,
the fault rank spends 3 s in a validation batch while the others wait in its all_reduce),
``slow_checkpoint_rank0`` (a checkpoint after ``--at-batch`` where rank 0 spends 4 s building it
while the others wait in the checkpoint's barrier), ``slow_epoch_end_hooks`` (at every epoch end one rank spends ``--hook-seconds`` in a hook while the others wait in a
barrier there: a user callback's ``on_train_epoch_end`` (rank 0 sleeps), the module's (rank 1 computes), a user
``Checkpoint`` callback's ``on_validation_end`` (rank 2 sleeps), the module's (rank 0 sleeps)), ``busy_rank0_hook`` (after batch ``--at-batch``
rank 0 computes for 4 s in ``on_train_batch_end`` while the others wait in a barrier), ``soak`` (all of these but the slow rank at
once: uneven loaders, a slow validation batch with a sync and a slow checkpoint every epoch),
``soak_waits`` (``soak``, plus waits that end: every ``--wait-every`` s rank 0 waits
``--wait-seconds`` in a user callback's ``on_train_batch_end`` (a synchronous upload) while the others
wait in the next step's all_reduce, every ``--loader-stall-every`` s the fault rank's loader stalls
``--loader-stall-seconds`` once (a network filesystem hiccup), and at every epoch end a user
callback's barrier after rank 0 spends ``--hook-seconds`` there).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DataLoader

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, Checkpoint, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_ncclx.config import AutoThresholdConfig, ConsensusConfig, StallAction, WatchdogConfig

FOREVER = 3600.0
PIPELINE_FAULTS = ("stuck_pipeline", "pipeline_wrong_peer", "pipeline_skip_send")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="none")
    p.add_argument("--fault-rank", type=int, default=1, help="-1: every rank")
    p.add_argument("--at-batch", type=int, default=2)
    p.add_argument("--dump-dir", required=True)
    p.add_argument("--root-dir", default=None)
    p.add_argument("--devices", type=int, default=3)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--train-step-seconds", type=float, default=3.0)
    p.add_argument("--slow-rank-threshold", type=float, default=None,
                   help="train_step_seconds of every rank except --noticer-rank (makes it notice first)")
    p.add_argument("--noticer-rank", type=int, default=None)
    p.add_argument("--on-stall", default="dump_and_exit")
    p.add_argument("--node-local", action="store_true", help="a separate dump folder per rank")
    p.add_argument("--no-gather", action="store_true")
    p.add_argument("--two-phase", action="store_true", help="two-phase gather at any size (digests, then full dumps)")
    p.add_argument("--csv-logger", action="store_true", help="log to a CSVLogger under --dump-dir/logs")
    p.add_argument("--then-validate", action="store_true", help="run trainer.validate after fit (same process group)")
    p.add_argument("--no-auto", action="store_true", help="no learned step threshold: train_step_seconds only")
    p.add_argument("--save-weights-only", action="store_true", help="with slow_state_dict")
    p.add_argument("--marker", default=None, help="the faulty rank writes this file when the fault starts")
    p.add_argument("--poll-interval", type=float, default=0.2, help="the watchdog's poll_interval_seconds")
    p.add_argument("--prefill", type=int, default=0,
                   help="collectives each rank runs in setup, to fill the flight recorder (bench: 20000)")
    p.add_argument("--no-step-collective", action="store_true",
                   help="no all_reduce of the job's own in training_step: the ranks wait in the strategy's collectives")
    p.add_argument("--validation-seconds", type=float, default=10.0)
    p.add_argument("--hook-seconds", type=float, default=4.0, help="slow_epoch_end_hooks: seconds in each hook")
    p.add_argument("--wait-every", type=float, default=300.0, help="soak_waits: seconds between rank 0's hook waits")
    p.add_argument("--wait-seconds", type=float, default=12.0, help="soak_waits: rank 0's wait in on_train_batch_end")
    p.add_argument("--loader-stall-every", type=float, default=420.0, help="soak_waits: seconds between loader stalls")
    p.add_argument("--loader-stall-seconds", type=float, default=10.0, help="soak_waits: one rank's loader stall")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of 'compute' in every training step")
    p.add_argument("--consensus-warmup", type=int, default=ConsensusConfig().warmup_steps)
    p.add_argument("--consensus-min-wait", type=float, default=ConsensusConfig().min_wait_seconds)
    p.add_argument("--no-consensus", action="store_true")
    p.add_argument("--step-noise", type=float, default=0.0,
                   help="each step sleeps --step-sleep x uniform(1 - noise, 1 + noise)")
    p.add_argument("--watchdog-defaults", action="store_true",
                   help="the watchdog's default thresholds (bench); only on_stall and the consensus switch set here")
    p.add_argument("--max-minutes", type=float, default=None, help="train this long (epochs without end)")
    p.add_argument("--epoch-size", type=int, default=64)
    p.add_argument("--die-after-announce", type=int, default=None,
                   help="this rank SIGKILLs itself once it has announced its dump of an event")
    p.add_argument("--report-store-keys", action="store_true",
                   help="rank 0 prints which keys of event 1 are left in the store after fit")
    return p.parse_args()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("LOCAL_RANK", "0"))


class Data(Dataset):
    def __init__(self, args: argparse.Namespace, n: int) -> None:
        self.args, self.n, self.calls = args, n, 0
        self.rng = random.Random(int(os.environ.get("LOCAL_RANK", "0")))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        a = self.args
        # batch_size 1, no workers: the n-th item fetched is the n-th training batch of this rank
        self.calls += 1
        if a.fault == "stuck_loader" and rank() == a.fault_rank and self.calls - 1 == a.at_batch:
            if a.marker:
                open(a.marker, "w").close()
            time.sleep(FOREVER)
        if a.fault == "healthy_slow" and self.calls - 1 == a.batches:
            time.sleep(4.5)  # the second epoch's first batch (workers starting): slower than a step
        if a.fault in ("uneven_loader", "soak", "slow_rank", "soak_waits"):
            time.sleep(self.rng.uniform(0.0, a.step_sleep))
        if a.fault == "soak_waits" and rank() == a.fault_rank and _due("loader", a.loader_stall_every):
            print(f"[rank {rank()}] soak: loader stall of {a.loader_stall_seconds:g} s", file=sys.stderr, flush=True)
            time.sleep(a.loader_stall_seconds)  # a network filesystem hiccup: the batch comes, late
        return torch.randn(4)


_LAST: dict[str, float] = {}


def _due(what: str, every: float) -> bool:
    """True once every ``every`` seconds of this process's run (not at its start)."""
    now = time.monotonic()
    last = _LAST.setdefault(what, now)
    if now - last >= every:
        _LAST[what] = now
        return True
    return False


def hold(how: str, seconds: float) -> None:
    """Rank-local work in a hook: ``sleep`` (an upload waiting on the network) or ``compute``."""
    if how == "sleep":
        time.sleep(seconds)
        return
    deadline, total = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        total += sum(i * i for i in range(1000))


def slow_hook(module: "Model", holder: int, how: str) -> None:
    """``--hook-seconds`` of work on rank ``holder`` while the others wait for it in a barrier."""
    if module.sub is None or module.trainer.sanity_checking:
        return
    if rank() == holder:
        hold(how, module.args.hook_seconds)
    dist.barrier(group=module.sub)


class SlowEpochEnd(Callback):
    """A user's epoch-end callback (listed before the watchdog): rank 0 uploads, the others wait."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        slow_hook(pl_module, 0, "sleep")


class PeriodicUpload(Callback):
    """A user's callback: every ``--wait-every`` s rank 0 uploads synchronously for
    ``--wait-seconds`` after a batch; the others go on into the next step and wait for it there."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if rank() == 0 and _due("upload", pl_module.args.wait_every):
            print(f"[rank 0] soak: hook wait of {pl_module.args.wait_seconds:g} s", file=sys.stderr, flush=True)
            time.sleep(pl_module.args.wait_seconds)


class BarrierAtEpochEnd(Callback):
    """A user's epoch-end callback: rank 0 spends ``--hook-seconds``, then every rank meets at a barrier."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        slow_hook(pl_module, 0, "sleep")


class SlowCheckpointHook(Checkpoint):
    """A user's checkpoint callback (Lightning moves it after every other callback): rank 2 sleeps
    in its on_validation_end."""

    def on_validation_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        slow_hook(pl_module, 2 % pl_module.trainer.world_size, "sleep")


class Model(LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        sharded = args.strategy.startswith("fsdp")  # a small net sharded per layer
        self.layer = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)) if sharded else torch.nn.Linear(4, 1)
        # a gradient bucket far larger than the 3-float all_reduce it meets when a rank skips that
        # all_reduce: gloo then aborts the rank that receives the bigger message (no dump there)
        self.wide = torch.nn.Linear(32, 32) if args.fault == "skip_world_collective" else None
        self.sub = self.pipe = None
        self.noise = random.Random(1000 + int(os.environ.get("LOCAL_RANK", "0")))

    def configure_model(self) -> None:
        if self.args.strategy == "fsdp2_ncclx" and not isinstance(self.layer[0].weight, torch.distributed.tensor.DTensor):
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.layer:
                fully_shard(layer, mesh=mesh)
            fully_shard(self.layer, mesh=mesh)

    def setup(self, stage: str) -> None:
        if dist.is_initialized() and self.args.fault in PIPELINE_FAULTS:
            self.pipe = dist.new_group(backend="gloo")  # made in setup, after the watchdog started
        if dist.is_initialized():
            self.sub = dist.new_group(backend="gloo")  # faults hit this group: a clean hang under gloo
            for start in range(0, self.args.prefill, 500):  # asynchronous in batches: no Python round trip each
                works = [dist.all_reduce(torch.ones(1), group=self.sub, async_op=True)
                         for _ in range(min(500, self.args.prefill - start))]
                for work in works:
                    work.wait()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        a, r = self.args, rank()
        faulty = (r == a.fault_rank or a.fault_rank == -1) and batch_idx == a.at_batch  # -1: every rank
        if a.fault == "healthy_slow":
            time.sleep(4.0 if self.global_step == 0 else 0.4 * (batch_idx % 3))
        if a.step_sleep:
            noise = self.noise.uniform(1.0 - a.step_noise, 1.0 + a.step_noise) if a.step_noise else 1.0
            time.sleep(a.step_sleep * noise * (1.5 if a.fault == "slow_rank" and r == a.fault_rank else 1.0))
        if faulty and a.marker:
            open(a.marker, "w").close()
        if faulty and a.fault == "stuck_train":
            time.sleep(FOREVER)
        if a.fault in PIPELINE_FAULTS and self.pipe is not None:
            self.pipeline_stage(faulty)
        if faulty and a.fault == "signal_then_stuck":  # an on-demand dump, then a real stall in the same step
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(FOREVER)
        if faulty and a.fault == "signal":
            os.kill(os.getpid(), signal.SIGUSR2)  # as `kill -USR2 <pid>` would
        if a.fault == "signal" and batch_idx > a.at_batch:
            time.sleep(0.5)  # let the on-demand event finish while training goes on
        if faulty and a.fault == "hold_gil":  # native code that never releases the GIL: no Python thread runs
            re.match(r"(a+)+$", "a" * 64 + "b")
        if faulty and a.fault == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops, the watchdog's too: alive, silent
        if faulty and a.fault == "die":
            os.kill(os.getpid(), signal.SIGKILL)  # OOM killer, segfault, node trouble: no Python runs
        if faulty and a.fault == "raise":
            raise RuntimeError(f"injected failure on rank {r} at batch {batch_idx}")
        if faulty and a.fault == "bigger_all_reduce" and self.sub is not None:
            dist.all_reduce(torch.ones(8), group=self.sub)
        t = torch.ones(3)
        if faulty and a.fault in ("dtype_mismatch", "half_dtype_mismatch"):  # gloo aborts a rank of the call
            t = torch.ones(3, dtype=torch.float64 if a.fault == "dtype_mismatch" else torch.float16)
        if a.no_step_collective:
            pass  # only the strategy's own collectives (DDP's buckets, FSDP's all-gathers and reduce-scatters)
        elif a.fault == "skip_world_collective" and dist.is_initialized():
            if not faulty:  # the faulty rank goes on into backward's bucket all_reduce on the same group
                dist.all_reduce(t)
        elif self.sub is not None:
            if faulty and a.fault == "skip_collective":
                pass
            elif faulty and a.fault == "other_collective":
                out = [torch.zeros(3) for _ in range(dist.get_world_size(self.sub))]
                dist.all_gather(out, t, group=self.sub)
            else:
                dist.all_reduce(t, group=self.sub)
        loss = self.layer(batch).sum()
        return loss if self.wide is None else loss + 0.0 * self.wide(torch.ones(32)).sum()

    def pipeline_stage(self, faulty: bool) -> None:
        """Stage r receives its activation from stage r-1 and sends its own on to r+1 (``recv`` on odd
        ranks, ``irecv().wait()`` on even ones); the faulty stage gets stuck before it sends
        (``stuck_pipeline``), sends to the stage before instead (``pipeline_wrong_peer``) or skips
        its send (``pipeline_skip_send``)."""
        r, world, act, fault = rank(), dist.get_world_size(), torch.ones(4), self.args.fault
        if r > 0:
            if r % 2:
                dist.recv(act, r - 1, group=self.pipe)
            else:
                dist.irecv(act, r - 1, group=self.pipe).wait()
        if faulty and fault == "stuck_pipeline":
            time.sleep(FOREVER)
        if faulty and fault == "pipeline_skip_send":
            return
        if r < world - 1:
            dist.send(act, r - 1 if faulty and fault == "pipeline_wrong_peer" else r + 1, group=self.pipe)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.args.fault == "busy_rank0_hook" and batch_idx == self.args.at_batch and self.sub is not None:
            if rank() == 0:  # rank-0-only work after the step (an evaluation, an upload): CPU-bound Python
                deadline, total = time.monotonic() + 4.0, 0
                while time.monotonic() < deadline:
                    total += sum(i * i for i in range(1000))
            dist.barrier(group=self.sub)  # the others wait here meanwhile

    def on_train_epoch_end(self) -> None:
        if self.args.fault == "slow_epoch_end_hooks":
            slow_hook(self, 1, "compute")
        if self.args.fault == "stuck_epoch_end" and self.sub is not None:
            if rank() == self.args.fault_rank:
                time.sleep(FOREVER)  # the others wait in the epoch-end all_reduce below
            dist.all_reduce(torch.ones(1), group=self.sub)

    def on_validation_end(self) -> None:
        if self.args.fault == "slow_epoch_end_hooks":
            slow_hook(self, 0, "sleep")

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        if self.args.then_validate and self.trainer.state.fn == "validate":
            time.sleep(0.5)  # long enough for the new watchdog thread to poll the store a few times
        if self.args.fault == "healthy_slow" and batch_idx == 0 and not self.trainer.sanity_checking:
            time.sleep(5.0)  # longer than train_step_seconds, shorter than validation_seconds
        if self.args.fault in ("slow_val_sync", "soak", "soak_waits") and not self.trainer.sanity_checking \
                and self.sub is not None:
            if rank() == self.args.fault_rank and batch_idx == 0 and self.global_step > self.args.at_batch:
                time.sleep(3.0)
            dist.all_reduce(torch.ones(1), group=self.sub)  # the others wait here meanwhile

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.args.fault == "healthy_slow":
            time.sleep(4.5)  # longer than train_step_seconds, shorter than checkpoint_seconds
        if self.args.fault in ("slow_checkpoint_rank0", "soak", "soak_waits") and rank() == 0:
            time.sleep(4.0)  # the others wait in the checkpoint's barrier meanwhile

    def state_dict(self, *args, **kwargs):
        if self.args.fault == "slow_state_dict" and self.trainer.training:
            time.sleep(4.5)  # a big model being gathered: longer than the 2-3 s step threshold
        return super().state_dict(*args, **kwargs)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class DieAfterAnnounce(Callback):
    """The rank SIGKILLs itself right after its watchdog announced its dump (and digest) of an
    event: killed mid-event, before the initiator asks it for anything."""

    def __init__(self, target: int) -> None:
        self.target = target

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank != self.target:
            return
        from lightning_ncclx.watchdog import StallWatchdog

        runtime = next(c.runtime for c in trainer.callbacks if isinstance(c, StallWatchdog) and c.runtime)
        announced = runtime.on_dumped

        def die(reason: str) -> None:
            if announced is not None:
                announced(reason)
            print(f"[rank {self.target}] killed after announcing its dump", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        runtime.on_dumped = die


def main() -> int:
    args = parse()
    if args.fault == "hang_at_exit":  # registered before Lightning's: runs after them, as a hung destroy would
        import atexit

        atexit.register(time.sleep, FOREVER)
    logging.basicConfig(level=getattr(logging, os.environ.get("NCCLX_TEST_LOG", "INFO")), stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    step = args.train_step_seconds
    if args.noticer_rank is not None and local != args.noticer_rank:
        step = args.slow_rank_threshold or 30.0
    cfg = WatchdogConfig(
        poll_interval_seconds=args.poll_interval, first_step_seconds=max(10.0, step) + 0.01 * args.prefill, train_step_seconds=step,
        validation_seconds=args.validation_seconds, checkpoint_seconds=10.0, collect_timeout_seconds=15.0,
        on_stall=StallAction(args.on_stall), max_dumps_per_run=2, gather_through_store=not args.no_gather,
        two_phase_gather_above_ranks=0 if args.two_phase else WatchdogConfig().two_phase_gather_above_ranks,
        auto=AutoThresholdConfig(enabled=not args.no_auto, multiplier=3.0, floor_seconds=min(2.0, step), warmup_steps=2),
        consensus=ConsensusConfig(enabled=not args.no_consensus, warmup_steps=args.consensus_warmup,
                                  min_wait_seconds=args.consensus_min_wait),
    )
    if args.watchdog_defaults:
        cfg = WatchdogConfig(on_stall=StallAction(args.on_stall), consensus=ConsensusConfig(enabled=not args.no_consensus))
    dump_dir = os.path.join(args.dump_dir, f"node{local}") if args.node_local else args.dump_dir
    callbacks: list = [SlowEpochEnd(), SlowCheckpointHook()] if args.fault == "slow_epoch_end_hooks" else []
    if args.fault == "soak_waits":
        callbacks += [PeriodicUpload(), BarrierAtEpochEnd()]
    if args.strategy in ("ddp_ncclx", "fsdp_ncclx", "fsdp2_ncclx"):
        import lightning_ncclx  # noqa: F401 - registers the strategy names
        from lightning_ncclx.config import FlightRecorderConfig, NcclxConfig, TimeoutConfig
        from lightning_ncclx.strategies import DDPNcclxStrategy, FSDP2NcclxStrategy, FSDPNcclxStrategy

        ncclx = NcclxConfig(
            backend="gloo", watchdog=cfg, flight_recorder=FlightRecorderConfig(dump_dir=dump_dir),
            timeouts=TimeoutConfig() if args.watchdog_defaults
            else TimeoutConfig(init_timeout_seconds=300.0, training_timeout_seconds=120.0))
        if args.strategy == "fsdp_ncclx":  # one FSDP unit per layer: an all-gather per layer and step
            strategy = FSDPNcclxStrategy(auto_wrap_policy={torch.nn.Linear}, ncclx=ncclx)
        else:
            strategy = (DDPNcclxStrategy if args.strategy == "ddp_ncclx" else FSDP2NcclxStrategy)(ncclx=ncclx)
    else:
        from lightning_ncclx.watchdog import StallWatchdog

        strategy = args.strategy
        callbacks.append(StallWatchdog(cfg, dump_dir=dump_dir))  # after the user's callbacks, as they are usually listed
    if args.die_after_announce is not None:
        callbacks.append(DieAfterAnnounce(args.die_after_announce))
    if args.fault == "healthy_slow":
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(args.dump_dir, "ckpt"), save_top_k=1, monitor=None))
    if args.fault in ("soak", "soak_waits"):
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(args.dump_dir, "ckpt"), save_top_k=1, monitor=None))
    if args.fault == "slow_checkpoint_rank0":
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(args.dump_dir, "ckpt"), save_top_k=-1, monitor=None,
                                         every_n_train_steps=args.at_batch))
    if args.fault == "slow_state_dict":
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(args.dump_dir, "ckpt"), save_top_k=-1, monitor=None,
                                         every_n_train_steps=3, save_weights_only=args.save_weights_only))
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, strategy=strategy,
        max_epochs=-1 if args.max_minutes else args.epochs,
        max_time={"seconds": round(args.max_minutes * 60)} if args.max_minutes else None,
        limit_train_batches=args.epoch_size if args.max_minutes else args.batches, limit_val_batches=2, num_sanity_val_steps=1,
        val_check_interval=args.at_batch + 2 if args.fault == "slow_val_sync" else None,
        callbacks=callbacks, enable_progress_bar=False,
        logger=CSVLogger(os.path.join(args.dump_dir, "logs"), name="job") if args.csv_logger else False, enable_model_summary=False,
        enable_checkpointing=args.fault in ("healthy_slow", "slow_state_dict", "slow_checkpoint_rank0", "soak", "soak_waits", "slow_epoch_end_hooks"), default_root_dir=args.root_dir or args.dump_dir,
    )
    loader = DataLoader(Data(args, max(64, args.epoch_size)), batch_size=1, shuffle=False)
    val = DataLoader(Data(argparse.Namespace(fault="none"), 8), batch_size=1)
    model = Model(args)
    trainer.fit(model, loader, val)
    if args.then_validate:
        trainer.validate(model, val)
    if args.report_store_keys:
        report_store_keys(trainer.global_rank, trainer.world_size)
    return 0


FIT_RETURNED_KEY = "test/fit_returned"
REPORT_WAIT_SECONDS = 30.0


def report_store_keys(rank: int, world: int) -> None:
    """Every rank counts itself once its fit returned (its watchdog and event listener stopped);
    rank 0 then prints which keys of event 1 are left: a rank still stopping its listener sets and
    deletes its own bell meanwhile, which is no key left."""
    from lightning_ncclx.backend.torch_api import default_store
    from lightning_ncclx.events.connection import StoreAddress

    store = StoreAddress.of(default_store()).connect()
    store.add(FIT_RETURNED_KEY, 1)
    if rank != 0:
        return
    deadline = time.monotonic() + REPORT_WAIT_SECONDS
    while store.add(FIT_RETURNED_KEY, 0) < world and time.monotonic() < deadline:
        time.sleep(0.1)
    names = ["ev/1/dumped", "ev/1/gone", "ev/1/roster", "ev/1/want", "ev/1/outcome", "ev/1/moved", "ev/1/leaving"]
    names += [f"ev/1/{kind}/{r}" for r in range(world) for kind in ("rank", "blob", "blob/0")]
    names += [f"bell/{r}" for r in range(world)]
    left = [name for name in names if store.check([name])]
    print("STORE_KEYS_LEFT " + json.dumps({"left": left, "meta": store.check(["ev/1/meta"])}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
