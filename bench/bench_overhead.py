"""Overhead of lightning-ncclx on a healthy job, measured side by side in one run.

a) Training-step time: Lightning's plain ``ddp`` with the recorder off (TORCH_FR_BUFFER_SIZE=0)
   against ``ddp_ncclx`` with the recorder at 2000 and 20000 entries and the watchdog on, and
   the same with live straggler detection on (``--straggler-interval`` batches per interval).
   Configurations are interleaved (A B C A B C ...) so machine drift hits all alike; the
   figure is the median of per-run medians, and the ratio is against plain ddp.
b) Cost per collective: a 16-float gloo all_reduce with the recorder at 0, 2000 and 20000; at
   world size 1 no byte crosses a socket, so the difference is the recorder's own cost.
c) Straggler detection's own work, in process: the main thread's readings per batch (five hook
   points) and the helper thread's summary of one 100-batch interval; resolves what a shared
   machine's step-time noise cannot.

    python bench/bench_overhead.py [--devices 2,4] [--repeats 3] [--steps 300] [--straggler-interval 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEP_CONFIGS = [("ddp", 0, "ddp, recorder off"), ("ddp_ncclx", 2000, "ddp_ncclx, FR 2000, watchdog"),
                ("ddp_ncclx", 20000, "ddp_ncclx, FR 20000, watchdog"),
                ("ddp_ncclx+straggler", 20000, "ddp_ncclx, FR 20000, watchdog, straggler detection"),
                ("ddp_ncclx+nodoorbell", 20000, "ddp_ncclx, FR 20000, watchdog polling the store (no doorbell)")]
"""(strategy, recorder entries, label); straggler detection runs only where the strategy says so."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(argv: list[str], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_", "LIGHTNING_NCCLX"))}
    env["PYTHONPATH"] = str(HERE.parent)
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def bench_steps(devices: int, repeats: int, steps: int, work: Path, straggler_interval: int = 100) -> list[dict]:
    medians: dict[str, list[float]] = {label: [] for _, _, label in STEP_CONFIGS}
    for repeat in range(repeats):
        for strategy, buffer_size, label in STEP_CONFIGS:
            out = work / f"steps_{devices}_{repeat}_{strategy}_{buffer_size}.json"
            name, _, extra = strategy.partition("+")
            run([sys.executable, str(HERE / "overhead_job.py"), "--out", str(out), "--strategy", name,
                 "--devices", str(devices), "--buffer-size", str(buffer_size), "--steps", str(steps),
                 "--straggler-interval", str(straggler_interval if extra == "straggler" else 0)]
                + (["--no-doorbell"] if extra == "nodoorbell" else []), cwd=work)
            medians[label].append(json.loads(out.read_text())["median_s"])
    base = statistics.median(medians[STEP_CONFIGS[0][2]])
    return [{"ranks": devices, "config": label, "median_step_ms": statistics.median(v) * 1e3,
             "ratio_vs_plain_ddp": statistics.median(v) / base, "runs_ms": [round(x * 1e3, 3) for x in v]}
            for label, v in medians.items()]


def bench_collectives(world_size: int, repeats: int, work: Path) -> list[dict]:
    per_op: dict[int, list[float]] = {0: [], 2000: [], 20000: []}
    for repeat in range(repeats):
        for buffer_size in per_op:
            out = work / f"coll_{world_size}_{repeat}_{buffer_size}.json"
            run([sys.executable, str(HERE / "collective_job.py"), "--buffer-size", str(buffer_size), "--world-size",
                 str(world_size), "--port", str(free_port()), "--out", str(out)], cwd=work)
            per_op[buffer_size].append(json.loads(out.read_text())["per_op_us"])
    base = statistics.median(per_op[0])
    return [{"ranks": world_size, "buffer_size": size, "per_all_reduce_us": statistics.median(v),
             "ratio_vs_off": statistics.median(v) / base, "runs_us": [round(x, 2) for x in v]} for size, v in per_op.items()]


def bench_straggler_hooks(batches: int = 200_000, interval: int = 100) -> dict:
    sys.path.insert(0, str(HERE.parent))
    from lightning_ncclx.straggler.timings import StepRecorder, summarize_records

    recorder = StepRecorder()

    def one_batch() -> None:
        recorder.batch_start()
        for mark in ("before_backward", "after_backward", "before_optimizer"):
            recorder.mark(mark)
        recorder.batch_end()

    start = time.perf_counter()
    for i in range(batches):
        one_batch()
        if (i + 1) % interval == 0:
            recorder.take()
    per_batch = (time.perf_counter() - start) / batches
    for _ in range(interval):
        one_batch()
    records = recorder.take()
    start = time.perf_counter()
    for _ in range(200):
        summarize_records(records, rank=0, interval=0, host="h")
    return {"main_thread_us_per_batch": per_batch * 1e6,
            "helper_thread_us_per_interval": (time.perf_counter() - start) / 200 * 1e6, "interval_batches": interval}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="2,4")
    parser.add_argument("--collective-ranks", default="1,2,4",
                        help="world sizes of the per-collective test (1: the recorder's own cost, no network)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--straggler-interval", type=int, default=100,
                        help="straggler.interval_steps of the straggler-detection configuration")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}", "steps": [], "collectives": []}
    with tempfile.TemporaryDirectory(prefix="ncclx-bench-") as tmp:
        work = Path(tmp)
        for devices in (int(d) for d in args.devices.split(",") if d):
            results["steps"] += bench_steps(devices, args.repeats, args.steps, work, args.straggler_interval)
        for world_size in (int(d) for d in args.collective_ranks.split(",") if d):
            results["collectives"] += bench_collectives(world_size, args.repeats, work)
    results["straggler_hooks"] = bench_straggler_hooks()
    print(f"machine: {results['machine']}")
    print("\n| ranks | configuration | median step (ms) | ratio vs plain ddp | per-repeat medians (ms) |"
          "\n|---|---|---|---|---|")
    for row in results["steps"]:
        print(f"| {row['ranks']} | {row['config']} | {row['median_step_ms']:.2f} | {row['ratio_vs_plain_ddp']:.3f} | "
              f"{', '.join(f'{x:.2f}' for x in row['runs_ms'])} |")
    print("\n| ranks | recorder entries | gloo all_reduce (µs) | ratio vs off |\n|---|---|---|---|")
    for row in results["collectives"]:
        print(f"| {row['ranks']} | {row['buffer_size']} | {row['per_all_reduce_us']:.1f} | {row['ratio_vs_off']:.3f} |")
    hooks = results["straggler_hooks"]
    print(f"\nstraggler detection, own work: {hooks['main_thread_us_per_batch']:.1f} µs per batch on the main thread, "
          f"{hooks['helper_thread_us_per_interval']:.0f} µs per {hooks['interval_batches']}-batch interval on its thread")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
