"""A tiny Lightning fit on CPU that records, on every rank, what lightning-ncclx set up.

Run by the strategy tests in a subprocess (Lightning's popen launcher re-runs this script for
every rank; torchrun runs it once per rank). Writes ``<out>/rank_<r>.json``.

    python fit_job.py --out DIR [--strategy ddp_ncclx] [--devices 2] [--instance] [--ncclx-json '{...}']
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if "--hydra-target" not in sys.argv:
    import lightning_ncclx  # noqa: F401  - registers the strategy names
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class TinyModel(LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.out = out
        self.seen: dict = {}

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        if batch_idx == 3:
            self._record()
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _record(self) -> None:
        from observe import what_this_rank_sees

        self.seen = what_this_rank_sees(self.trainer)
        self.seen["watchdog_train_step_seconds"] = [c.config.train_step_seconds for c in self.trainer.callbacks
                                                    if type(c).__name__ == "StallWatchdog"]

    def on_train_end(self) -> None:
        from lightning_ncclx.backend.timeouts import current_timeouts

        self.seen["timeouts_at_end"] = current_timeouts()
        path = self.out / f"rank_{self.trainer.global_rank}.json"
        path.write_text(json.dumps(self.seen, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--strategy", default="ddp_ncclx")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--instance", action="store_true", help="pass a strategy instance built from --ncclx-json")
    parser.add_argument("--ncclx-json", default="{}")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hydra-target", action="store_true", help="build the strategy with hydra.utils.instantiate, no prior import")
    parser.add_argument("--user-watchdog", type=float, default=None, help="add the user's own StallWatchdog (its train_step_seconds)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ncclx = json.loads(args.ncclx_json)
    strategy: object = args.strategy
    if args.instance:
        from lightning_ncclx.strategies import DDPNcclxStrategy

        start_method = "spawn" if args.strategy.endswith("_spawn") else "popen"
        strategy = DDPNcclxStrategy(ncclx=ncclx, start_method=start_method)
    if args.hydra_target:
        from hydra.utils import instantiate

        assert "lightning_ncclx" not in sys.modules
        strategy = instantiate({"_target_": "lightning_ncclx.strategies.DDPNcclxStrategy", "ncclx": ncclx})
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    callbacks = []
    if args.user_watchdog is not None:
        from lightning_ncclx.config import WatchdogConfig
        from lightning_ncclx.watchdog import StallWatchdog

        callbacks.append(StallWatchdog(WatchdogConfig(train_step_seconds=args.user_watchdog)))
    trainer = Trainer(
        callbacks=callbacks,
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=strategy,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(args.out),
    )
    trainer.fit(TinyModel(args.out), DataLoader(data, batch_size=4))


if __name__ == "__main__":
    sys.exit(main())
