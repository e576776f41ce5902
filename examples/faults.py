"""Faults injected on purpose, to see the stall watchdog name the culprit (examples only: the
library never does this). Enabled with ``+fault=<preset>`` (``conf/fault/``)::

    python examples/train_fsdp.py trainer=ddp_sim +fault=skip_collective fault.rank=2 fault.step=4

Every rank runs one extra ``all_reduce`` per training batch on a side process group (the
default backend: gloo on CPU, NCCL on GPUs), before the step's own collectives. On batch
``step`` rank ``rank``:

- ``skip_collective``: skips that all_reduce (and goes on into the step's collectives);
- ``wrong_op``: calls ``all_gather`` where the others call ``all_reduce``;
- ``stuck``: sleeps forever, in ``training_step`` (``where: training_step``) or in the data
  loader while it fetches that batch (``where: loader``).

The other ranks then wait in a collective; the watchdog notices, dumps every rank and writes
the summary. A side group keeps the hang clean: on gloo, mismatched ops on the default group
can fail with a size error instead of hanging.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)
KINDS = ("skip_collective", "wrong_op", "stuck")
PLACES = ("training_step", "loader")
FOREVER_SECONDS = 3600.0


class FaultInjector(Callback):
    def __init__(self, kind: str, rank: int = 1, step: int = 3, where: str = "training_step") -> None:
        if kind not in KINDS:
            raise ValueError(f"fault.kind={kind!r} is not valid: expected one of {', '.join(KINDS)}")
        if where not in PLACES:
            raise ValueError(f"fault.where={where!r} is not valid: expected one of {', '.join(PLACES)}")
        if step < 0 or rank < 0:
            raise ValueError(f"fault.rank={rank} and fault.step={step} must be >= 0")
        self.kind, self.rank, self.step, self.where = kind, rank, step, where
        self._group: Any = None
        self._batches = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        import torch.distributed as dist

        if self.rank >= trainer.world_size:
            raise ValueError(f"fault.rank={self.rank} is not a rank of this {trainer.world_size}-rank job")
        if dist.is_available() and dist.is_initialized() and self._group is None:
            self._group = dist.new_group()  # collective: every rank creates it

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.kind == "stuck" and self.where == "loader" and trainer.global_rank == self.rank:
            dataset = getattr(getattr(trainer, "datamodule", None), "train_set", None)
            if dataset is None or not hasattr(dataset, "fault_hook"):
                raise ValueError("fault.where=loader needs the examples' SyntheticTokens data module")
            batch_size = trainer.datamodule.batch_size
            calls = [0]

            def hook(index: int) -> None:
                calls[0] += 1
                if (calls[0] - 1) // batch_size == self.step:
                    self._announce(trainer, "is stuck in its data loader")
                    time.sleep(FOREVER_SECONDS)

            dataset.fault_hook = hook

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        n, self._batches = self._batches, self._batches + 1
        faulty = trainer.global_rank == self.rank and n == self.step
        if self.kind == "stuck":
            if faulty and self.where == "training_step":
                self._announce(trainer, "is stuck in training_step")
                time.sleep(FOREVER_SECONDS)
            return
        if self._group is None:
            return
        import torch.distributed as dist

        tensor = torch.ones(4, device=pl_module.device)
        if faulty and self.kind == "skip_collective":
            self._announce(trainer, "skips the all_reduce the other ranks call")
            return
        if faulty and self.kind == "wrong_op":
            self._announce(trainer, "calls all_gather where the other ranks call all_reduce")
            out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self._group))]
            dist.all_gather(out, tensor, group=self._group)
            return
        dist.all_reduce(tensor, group=self._group)

    def _announce(self, trainer: Any, what: str) -> None:
        print(f"[fault] rank {trainer.global_rank} {what} at batch {self.step} ({self.kind})", flush=True)
