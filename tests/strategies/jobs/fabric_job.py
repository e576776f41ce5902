"""A tiny Lightning Fabric run with ``strategy="ddp_ncclx"`` on CPU; writes ``<out>/rank_<r>.json``.

    python fabric_job.py --out DIR [--devices 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import lightning_ncclx  # noqa: F401 - registers the strategy names
import torch
from lightning.fabric import Fabric


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy="ddp_ncclx")
    fabric.launch()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    fabric.strategy.ncclx_training_started()
    from lightning_ncclx.backend.timeouts import current_timeouts
    from torch._C._distributed_c10d import _dump_fr_trace
    import pickle

    ops = [e["profiling_name"] for e in pickle.loads(_dump_fr_trace(True, False, False)).get("entries", [])]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank_{fabric.global_rank}.json").write_text(json.dumps({
        "strategy_class": type(fabric.strategy).__name__,
        "buffer": os.environ.get("TORCH_FR_BUFFER_SIZE"),
        "timeouts": current_timeouts(),
        "ops": ops,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
