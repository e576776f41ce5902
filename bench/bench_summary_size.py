#!/usr/bin/env python
"""The summary files of a 16,384-rank stall event: their sizes and the time to write them, for
the tree here and (``--baseline``) another checkout of the package, side by side in one run.

The event folder is what a whole simulated event leaves (``scale_job.py``: 8 ranks per host, a
default and a tensor-parallel group per host, one rank stuck in its data loader): the initiator
host's ranks in the folder, every other host's under ``ranks/<host>/``, as the gather places
them. It is made once under ``--root`` (a RAM disk: about 1.7 GB at 16,384 ranks) and kept.

Each round runs one child process per tree, in turn: it analyzes the folder (not timed), removes
the report files, then times ``write_reports`` into the folder (each file's time from the call's
start, read from the files' modification times) and reports each file's size.

    python bench/bench_summary_size.py --root /dev/shm/ncclx-summary-size --baseline /tmp/base
    python bench/bench_summary_size.py --ranks 1024 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_job  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEPS = 24
REPORTS = ("summary.json", "summary-ranks.json", "summary.txt", "summary.html")

_CHILD = """
import json, os, sys, time
from pathlib import Path
from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.report import write_reports
folder = Path(sys.argv[1])
summary = analyze_folder(folder)
for name in {reports!r}:
    (folder / name).unlink(missing_ok=True)
start = time.time()
t0 = time.perf_counter()
paths = write_reports(summary, folder)
total = time.perf_counter() - t0
files = {{p.name: {{"bytes": p.stat().st_size, "at_s": round(p.stat().st_mtime - start, 3)}}
         for p in map(Path, paths.values())}}
print(json.dumps({{"seconds": round(total, 3), "files": files, "kind": summary.classification.kind.value,
                  "culprits": list(summary.culprit_ranks)[:4]}}))
"""


def _host_folder(root: Path, rank: int) -> Path:
    host = scale_job.host_of(rank)
    return root if host == scale_job.host_of(0) else root / "ranks" / host


def _write_host(args: tuple[Path, int, int]) -> None:
    root, first, world = args
    folder = _host_folder(root, first)
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(first, min(first + scale_job.RANKS_PER_HOST, world)):
        paths = scale_job.files_of(folder, rank)
        paths[0].write_bytes(__import__("pickle").dumps(scale_job.trace(rank, world, STEPS), protocol=4))
        ctx = scale_job.context(rank, world, "stall-001")
        del ctx["pg_config"]  # the traces declare the groups: 16,384 contexts of 16,384 ranks each would be 1.6 GB
        paths[1].write_text(json.dumps(ctx))
        paths[2].write_text(scale_job.stacks(rank, world))


def generate(folder: Path, world: int) -> None:
    marker = folder / ".complete"
    if marker.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with Pool(2) as pool:
        pool.map(_write_host, [(folder, first, world) for first in range(0, world, scale_job.RANKS_PER_HOST)],
                 chunksize=16)
    marker.write_text("")
    print(f"made {world} ranks in {folder} in {time.monotonic() - started:.0f} s", file=sys.stderr)


def run_tree(tree: Path, folder: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _CHILD.format(reports=REPORTS), str(folder)], env=env, check=True,
                          capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--root", type=Path, default=Path("/dev/shm/ncclx-summary-size"))
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout's root, run side by side")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    folder = args.root / f"stall-{args.ranks}" / "stall-001"
    generate(folder, args.ranks)
    trees = {"this tree": REPO} | ({"baseline": args.baseline} if args.baseline else {})
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            runs[name].append(run_tree(tree, folder))
            print(name, json.dumps(runs[name][-1]), file=sys.stderr)
    print(f"| tree | {' | '.join(REPORTS)} | written after (s): summary.json, all | kind |")
    print("|---|" + "---|" * (len(REPORTS) + 2))
    for name, rounds in runs.items():
        last = rounds[-1]
        sizes = " | ".join(f"{last['files'][r]['bytes'] / 1024:,.1f} KiB" if r in last["files"] else "-"
                           for r in REPORTS)
        first = statistics.median(r["files"]["summary.json"]["at_s"] for r in rounds)
        total = statistics.median(r["seconds"] for r in rounds)
        print(f"| {name} | {sizes} | {first:.2f}, {total:.2f} (median of {len(rounds)}) | {last['kind']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
