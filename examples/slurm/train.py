"""A small Lightning job on ``ddp_ncclx`` for SLURM: one process per task, started by ``srun``
(``train.sbatch``) or by hydra-submitit-launcher (``-m hydra/launcher=slurm``). Lightning's
``SLURMEnvironment`` reads the ranks from ``SLURM_*``; nothing here launches processes.

    srun python examples/slurm/train.py trainer.num_nodes=2 trainer.devices=4
    python examples/slurm/train.py -m hydra/launcher=slurm trainer.num_nodes=2 trainer.devices=4
    python examples/slurm/train.py trainer.accelerator=cpu trainer.devices=1        # smoke test, no SLURM
    python examples/slurm/train.py +fault.rank=3 +fault.at_batch=20                 # rank 3 stalls: try the watchdog

Every rank writes its dumps to ``ncclx.flight_recorder.dump_dir`` (node-local by default in
``conf/config.yaml``); the rank that notices a stall pulls every rank's dump through the job's
store and writes ``summary.{json,txt,html}`` on its own node. ``gather_dumps.sh`` copies the node
folders to shared storage afterwards.
"""

from __future__ import annotations

import os
import time

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset

import lightning_ncclx  # noqa: F401 - registers ddp_ncclx
from lightning.pytorch import LightningModule, Trainer
from lightning_ncclx.strategies import DDPNcclxStrategy


class RandomData(Dataset):
    def __init__(self, n: int, dim: int) -> None:
        self.n, self.dim = n, dim

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(self.dim)


class Model(LightningModule):
    def __init__(self, dim: int, fault: DictConfig | None) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.ReLU(), torch.nn.Linear(dim, 1))
        self.fault = fault

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        f = self.fault
        if f is not None and self.global_rank == int(f.get("rank", 1)) and batch_idx == int(f.get("at_batch", 10)):
            time.sleep(3600)  # this rank stops; the others wait in DDP's gradient all-reduce
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    strategy = DDPNcclxStrategy(ncclx=cfg.ncclx)  # DictConfig accepted; validated on every rank
    trainer = Trainer(strategy=strategy, **OmegaConf.to_container(cfg.trainer, resolve=True))
    if trainer.global_rank == 0:
        print(f"cluster environment: {type(trainer.strategy.cluster_environment).__name__}; "
              f"world size {trainer.world_size}; node-local dumps in {os.path.expandvars(str(cfg.ncclx.flight_recorder.dump_dir))}")
    data = DataLoader(RandomData(cfg.data.samples, cfg.data.dim), batch_size=cfg.data.batch_size, num_workers=2)
    trainer.fit(Model(cfg.data.dim, cfg.get("fault")), data)


if __name__ == "__main__":
    main()
