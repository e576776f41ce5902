"""A one-rank Lightning fit whose training_step raises; the launcher's SIGTERM lands while the
watchdog writes the exception's evidence, and the job's SIGTERM handler raises, as Lightning's
does when its broadcast meets a gone peer. Usage: ``sigterm_in_dump_job.py ROOT_DIR`` (dumps under ``ROOT_DIR/ncclx_dumps``); prints
``SIGTERM handled`` once the handler ran."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_ncclx.watchdog.runtime import WatchdogRuntime


class Boom(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        raise RuntimeError("boom in training_step")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _raising_handler(signum: int, frame: Any) -> None:
    print("SIGTERM handled", flush=True)
    raise RuntimeError("the SIGTERM handler's broadcast: Connection closed by peer")


def _sigterm_as_the_dump_starts() -> None:
    take_part = WatchdogRuntime._take_part

    def take_part_after_sigterm(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher ends the job as the evidence is written
        return take_part(self, *args, **kwargs)

    WatchdogRuntime._take_part = take_part_after_sigterm


def main() -> int:
    signal.signal(signal.SIGTERM, _raising_handler)
    _sigterm_as_the_dump_starts()
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
    trainer = Trainer(strategy="ddp_ncclx", accelerator="cpu", devices=1, max_steps=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=sys.argv[1])
    try:
        trainer.fit(Boom(), data)
    except RuntimeError as error:
        print(f"fit raised: {error}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
