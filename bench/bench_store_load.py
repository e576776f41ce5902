"""How the watchdog's store traffic grows with the number of ranks, by simulation.

One real ``TCPStore`` server (torch's, libuv backend) in its own process, and N clients that do
exactly what each rank's watchdog thread does through ``lightning_ncclx.dump.coordinator``: the
same keys, calls and interval. Steady state: every ``--poll`` seconds one ``check`` of the next
event's ``meta`` key. Event: one client proposes with ``compare_set``; every client notices it at
its next poll, announces its dump (``set`` + ``add``, and with ``--blob-bytes`` a gzip'd dump
through the store, as ``gather_through_store`` does); the initiator then reads every
announcement. Clients are threads spread over a few processes, each with its own connection,
all connected before the clock starts (here a client connection takes ~0.2 s: the sandbox's
hostname lookup fails once per socket).

    python bench/bench_store_load.py --ranks 256,1024,4096 --processes 16
    python bench/bench_store_load.py --ranks 256,1024 --blob-bytes 300000   # dumps through the store

Measured per N: store-server CPU in steady state (% of one core), ``check`` latency p50/p99,
time for the event to reach every client, bytes moved through the store per event; then a
linear fit of server CPU and fan-out projected to 16,384 and 65,536 ranks.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from datetime import timedelta

PREFIX = "lightning_ncclx"


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server(port_queue: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                          timeout=timedelta(seconds=300))
    port_queue.put(store.port)
    stop.wait()


def _clients(port: int, ranks: list[int], poll: float, blob_bytes: int, steady_seconds: float,
             ready: mp.Queue, go: mp.Queue, out: mp.Queue) -> None:  # type: ignore[type-arg]
    import torch.distributed as dist

    # Connect every client first: creating a TCPStore client holds this process's GIL while it
    # connects, which would stall the other threads' timed calls.
    stores = {}
    for rank in ranks:
        raw = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
        stores[rank] = dist.PrefixStore(PREFIX, raw)
        stores[rank].append("procs/sim", json.dumps({"rank": rank, "pid": os.getpid()}) + "\n")  # register_process
    ready.put(len(ranks))
    start_at = go.get()
    event_at = start_at + steady_seconds
    results: dict[int, dict] = {}
    blob = os.urandom(blob_bytes) if blob_bytes else b""

    def client(rank: int) -> None:
        store = stores[rank]
        latencies: list[float] = []
        seen_at = None
        time.sleep(max(0.0, start_at - time.time()) + (rank % 97) / 97 * poll)  # watchdogs start apart
        while True:
            now = time.time()
            if rank == 0 and now >= event_at and seen_at is None:
                store.compare_set("ev/1/meta", "", json.dumps({"name": "stall-001", "reason": "stall", "initiator": 0}))
            t0 = time.perf_counter()
            found = store.check(["ev/1/meta"])  # Coordinator.poll: one check per interval
            if now < event_at:
                latencies.append(time.perf_counter() - t0)
            if found:
                seen_at = time.time()
                store.get("ev/1/meta")
                store.check(["ev/1/meta"])  # announce_dumped: is_closed
                if blob:
                    store.set(f"ev/1/blob/{rank}", blob)
                store.set(f"ev/1/rank/{rank}", json.dumps({"host": f"h{rank // 8}", "files": ["a", "b", "c"]}))
                store.add("ev/1/dumped", 1)
                break
            time.sleep(poll)
        results[rank] = {"latencies": latencies, "seen_at": seen_at}

    threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(steady_seconds + 240)
    out.put({"results": results, "event_at": event_at})


def measure(n: int, poll: float, blob_bytes: int, steady_seconds: float, processes: int) -> dict:
    ctx = mp.get_context("spawn")
    port_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(port_queue, stop), daemon=True)
    server.start()
    port = port_queue.get(timeout=60)
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    workers = []
    connect_start = time.time()
    for p in range(processes):
        worker = ctx.Process(target=_clients, args=(port, list(range(p, n, processes)), poll, blob_bytes,
                                                   steady_seconds, ready, go, out), daemon=True)
        worker.start()
        workers.append(worker)
    connected = sum(ready.get(timeout=3600) for _ in workers)
    connect_s = time.time() - connect_start
    start_at = time.time() + 1.0
    for _ in workers:
        go.put(start_at)
    event_at = start_at + steady_seconds
    while time.time() < start_at + poll:
        time.sleep(0.05)
    cpu0, wall0 = _cpu_seconds(server.pid), time.time()
    while time.time() < event_at:
        time.sleep(0.05)
    cpu1, wall1 = _cpu_seconds(server.pid), time.time()
    merged: dict[int, dict] = {}
    for _ in workers:
        merged.update(out.get(timeout=steady_seconds + 300)["results"])
    for worker in workers:
        worker.join(30)
    stop.set()
    server.join(10)
    latencies = sorted(x for r in merged.values() for x in r["latencies"])
    seen = [r["seen_at"] for r in merged.values() if r["seen_at"] is not None]
    small = n * (60 + 8)  # announcement JSON + counter per rank
    return {
        "ranks": n, "connected": connected, "connect_s": connect_s,
        "server_cpu_pct": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
        "requests_per_s": n / poll, "checks_timed": len(latencies),
        "p50_ms": 1e3 * latencies[len(latencies) // 2] if latencies else float("nan"),
        "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)] if latencies else float("nan"),
        "fanout_s": (max(seen) - event_at) if len(seen) == n else float("nan"),
        "clients_seen": len(seen),
        "event_bytes": n * blob_bytes + small,
    }


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs) or 1.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var
    return slope, mean_y - slope * mean_x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="256,1024,4096")
    parser.add_argument("--poll", type=float, default=0.5, help="the watchdog's poll_interval_seconds (default 0.5)")
    parser.add_argument("--blob-bytes", type=int, default=0,
                        help="bytes of each rank's gzip'd dump sent through the store (gather_through_store)")
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    rows = [measure(int(n), args.poll, args.blob_bytes, args.steady_seconds, args.processes)
            for n in args.ranks.split(",")]
    print(f"\nmachine: {os.cpu_count()} cores; poll {args.poll} s; blob {args.blob_bytes} B/rank; "
          f"{args.processes} client processes\n")
    print("| ranks | store requests/s | server CPU (% of a core) | check p50 (ms) | check p99 (ms) "
          "| event reaches every rank (s) | bytes per event |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['requests_per_s']:.0f} | {r['server_cpu_pct']:.1f} | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {r['fanout_s']:.2f} ({r['clients_seen']}/{r['ranks']}) | {r['event_bytes']:,} |")
    if len(rows) >= 2:
        xs = [float(r["ranks"]) for r in rows]
        cpu = _fit(xs, [r["server_cpu_pct"] for r in rows])
        for n in (16384, 65536):
            load = cpu[0] * n + cpu[1]
            verdict = ("over one core: torch's TCPStore server runs its requests on one thread, so it falls "
                       "behind and latency grows without bound") if load > 100 else "within one core"
            print(f"projected at {n}: {n / args.poll:,.0f} requests/s, server CPU {load:.0f} % of a core "
                  f"(linear fit): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
