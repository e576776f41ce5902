"""Time a small gloo all_reduce with the flight recorder at a given size (one process per rank).

    python collective_job.py --buffer-size B --world-size N --port P --out FILE --iters ITERS
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, args: argparse.Namespace) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.buffer_size)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.world_size,
                            timeout=timedelta(seconds=120))
    tensor = torch.ones(16)
    for _ in range(200):
        dist.all_reduce(tensor)
    samples = []
    for _ in range(args.rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(tensor)
        samples.append((time.perf_counter() - start) / args.iters)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"per_op_us": statistics.median(samples) * 1e6, "samples_us": [s * 1e6 for s in samples]}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--buffer-size", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    mp.start_processes(worker, args=(args,), nprocs=args.world_size, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
