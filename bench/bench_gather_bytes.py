#!/usr/bin/env python
"""Bytes through the job's store per stall event: the full gather against the two-phase gather.

One rank's dump as ``bench_analyzer.py`` makes it (torch's format 2.10, legacy-NCCL-like entries
with 5 frames each, ``pg_config`` listing every rank), written into the plugin's layout with a context.json
and a stacks file; then packed as the full gather sends it (``pack_files``) and as its digest
(``make_digest``, inside the compressed announcement that carries it). Per event at N ranks:
full = N x full blob; two-phase = N x announcement + (culprits + peers) x full blob (1 culprit and
the default 2 peers here).

    .venv/bin/python bench/bench_gather_bytes.py [--entries 20000] [--ranks 1024,16384,65536]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analyzer import _dump_bytes  # noqa: E402

from lightning_ncclx.dump.digest import make_digest  # noqa: E402
from lightning_ncclx.events.packing import pack_files  # noqa: E402
from lightning_ncclx.events.wire import Announcement  # noqa: E402

STACKS = ("--- thread 'ncclx-watchdog-rank5' (id 2) ---\n" + "  File \"threading.py\", line 1, in run\n" * 12
          + "--- thread 'MainThread' (id 1) ---\n" + "".join(f"  File \"train/loop.py\", line {i}, in step\n"
                                                          for i in range(30)))


def one_rank(folder: Path, world: int, entries: int) -> list[Path]:
    rank = 5
    trace = folder / f"rank_{rank:05d}.nccl.fr.pkl"
    trace.write_bytes(_dump_bytes(world, entries, rank))
    context = {"schema": "lightning-ncclx/context/1", "rank": rank, "world_size": world, "host": "node-0001",
               "phase": "train_step", "step": 1234, "flight_recorder": {"TORCH_FR_BUFFER_SIZE": str(entries)},
               "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(world))}}}
    ctx = folder / f"rank_{rank:05d}.context.json"
    ctx.write_text(json.dumps(context))
    stacks = folder / f"rank_{rank:05d}.stacks.txt"
    stacks.write_text(STACKS)
    return [trace, ctx, stacks]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--ranks", default="1024,16384,65536")
    parser.add_argument("--pulled", type=int, default=3, help="full dumps a two-phase gather pulls (culprit + peers)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; {args.entries} entries per rank "
          f"(the default buffer), {args.pulled} full dumps pulled")
    print("\n| ranks | full dump per rank (KiB) | announcement with digest per rank (KiB) | make digest (ms) | full gather per event "
          "| two-phase gather per event |")
    print("|---|---|---|---|---|---|")
    for world in (int(r) for r in args.ranks.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            files = one_rank(Path(tmp), world, args.entries)
            full = len(pack_files(files))
            start = time.perf_counter()
            announcement = Announcement(5, "node-0001", tuple(p.name for p in files), f"{tmp}/stall-001",
                                        make_digest(files))
            digest = len(announcement.encode())
            took = (time.perf_counter() - start) * 1e3
        full_event = world * full
        two_phase = world * digest + args.pulled * full
        print(f"| {world} | {full / 1024:.0f} | {digest / 1024:.2f} | {took:.0f} | {_size(full_event)} | "
              f"{_size(two_phase)} |")
    return 0


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


if __name__ == "__main__":
    sys.exit(main())
