"""The cost of the deadline on the plugin's store requests: one ``read`` of a present key on a
connection whose requests run on a thread of their own (what every rank's watchdog uses), beside
the same read on a connection called directly, against one local TCPStore, interleaved rounds.

    python bench/bench_store_request.py --reads 5000 --rounds 5

Prints wall and process CPU time per read (the TCPStore server runs in this process, so its CPU
is counted too) and the ratio of the median round, deadline over direct."""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from datetime import timedelta

import torch.distributed as dist

from lightning_ncclx.events.connection import StoreAddress, StoreClient


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    address = StoreAddress("127.0.0.1", server.port)
    clients = {"direct": StoreClient(address.connect(), op_timeout_seconds=0.5),
               "deadline": StoreClient(opener=address.connect, op_timeout_seconds=0.5)}
    clients["deadline"].set("key", b"value")
    wall: dict[str, list[float]] = {name: [] for name in clients}
    cpu: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(args.rounds):
        for name, client in clients.items():
            started, cpu_started = time.perf_counter(), _cpu()
            for _ in range(args.reads):
                client.read("key")
            wall[name].append((time.perf_counter() - started) / args.reads * 1e6)
            cpu[name].append((_cpu() - cpu_started) / args.reads * 1e6)
    print("| connection | wall per read (µs), median | CPU per read (µs), median | rounds (wall µs) |")
    print("|---|---|---|---|")
    for name in clients:
        print(f"| {name} | {statistics.median(wall[name]):.0f} | {statistics.median(cpu[name]):.0f} | "
              f"{', '.join(f'{v:.0f}' for v in wall[name])} |")
    print(f"\nratio deadline / direct: wall x{statistics.median(wall['deadline']) / statistics.median(wall['direct']):.2f}, "
          f"CPU x{statistics.median(cpu['deadline']) / statistics.median(cpu['direct']):.2f}")
    for client in clients.values():
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
