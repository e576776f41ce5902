"""How the watchdog's store traffic grows with the number of ranks, by simulation.

One real ``TCPStore`` server (torch's, libuv backend) in its own process, and N clients that do
exactly what each rank's watchdog does through ``lightning_ncclx.events.coordinator`` and
``lightning_ncclx.events.doorbell``: the same keys and calls. Two watchdog modes, side by side:

- ``doorbell`` (the default, ``event_doorbell: true``): each client holds one blocking ``wait``
  on ``bell/<rank>``; the initiator proposes (``compare_set``) and rings every bell with one
  ``multi_set``; each client wakes, deletes its bell and reads the event.
- ``poll`` (``event_doorbell: false``): one ``check`` of the next event's ``meta`` key per
  ``--poll`` seconds; the event is seen at the next poll.

Then every client announces its dump (``set`` + ``add``, and with ``--blob-bytes`` a gzip'd dump
through the store). Clients are threads spread over ``--processes`` processes, each with its own
connection, all connected before the clock starts. Another client checks a key every 20 ms
throughout, to show what the watchdogs' traffic does to the job's own store requests.

    python bench/bench_store_load.py                       # 256, 1024, 4096, 16384 ranks, both modes

(The libuv server listens on IPv6 and torch looks up each client socket's name; where the
resolver times out on ``::ffff:127.0.0.1``, as in this sandbox, every connection costs ~0.2 s
until ``/etc/hosts`` names it: ``::ffff:127.0.0.1 localhost``.)
    python bench/bench_store_load.py --ranks 256,1024 --blob-bytes 300000   # dumps through the store

Measured per N and mode: requests/s the clients achieved in steady state, store-server CPU (% of
one core), the other client's ``check`` latency p50/p99, time for the event to reach every
client, the ring's duration, bells left behind, bytes per event; then linear fits projected past
the largest N measured.
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
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lightning_ncclx.events.keys import STORE_PREFIX as PREFIX  # noqa: E402
from lightning_ncclx.events.doorbell import ring_every_rank  # noqa: E402


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


def _clients(port: int, ranks: list[int], mode: str, poll: float, blob_bytes: int, steady_seconds: float,
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
    results: dict[int, dict] = {}
    blob = os.urandom(blob_bytes) if blob_bytes else b""

    def take_part(store: Any, rank: int) -> None:
        store.get("ev/1/meta")
        store.check(["ev/1/meta"])  # announce_dumped: is_closed
        if blob:
            store.set(f"ev/1/blob/{rank}", blob)
        store.set(f"ev/1/rank/{rank}", json.dumps({"host": f"h{rank // 8}", "files": ["a", "b", "c"]}))
        store.add("ev/1/dumped", 1)

    def polling_client(rank: int) -> None:
        """WatchdogRuntime without a doorbell: Coordinator.poll, one check per interval."""
        store = stores[rank]
        time.sleep(max(0.0, start_at - time.time()) + (rank % 97) / 97 * poll)  # watchdogs start apart
        checks = 1
        while not store.check(["ev/1/meta"]):
            time.sleep(poll)
            checks += 1
        results[rank] = {"seen_at": time.time(), "checks": checks}
        take_part(store, rank)

    def doorbell_client(rank: int) -> None:
        """WatchdogRuntime with its doorbell: one wait on bell/<rank>; on the ring, delete it and poll."""
        store = stores[rank]
        time.sleep(max(0.0, start_at - time.time()) + (rank % 97) / 97 * poll)
        store.wait([f"bell/{rank}"], timedelta(seconds=steady_seconds + 240))
        results[rank] = {"seen_at": time.time(), "checks": 0}
        store.get(f"bell/{rank}")
        store.delete_key(f"bell/{rank}")
        if store.check(["ev/1/meta"]):
            take_part(store, rank)

    target = doorbell_client if mode == "doorbell" else polling_client
    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(steady_seconds + 240)
    out.put({"results": results})


def _probe(port: int, until: float, latencies: list[float]) -> None:
    """Another client of the same store (the job's own traffic): one check every 20 ms."""
    import torch.distributed as dist

    store = dist.PrefixStore(PREFIX, dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300)))
    while time.time() < until:
        t0 = time.perf_counter()
        store.check(["probe"])
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.02)


def measure(n: int, mode: str, poll: float, blob_bytes: int, steady_seconds: float, processes: int) -> dict:
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    port_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(port_queue, stop), daemon=True)
    server.start()
    port = port_queue.get(timeout=60)
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    workers = []
    connect_start = time.time()
    for p in range(processes):
        worker = ctx.Process(target=_clients, args=(port, list(range(p, n, processes)), mode, poll, blob_bytes,
                                                   steady_seconds, ready, go, out), daemon=True)
        worker.start()
        workers.append(worker)
    connected = sum(ready.get(timeout=3600) for _ in workers)
    connect_s = time.time() - connect_start
    initiator = dist.PrefixStore(PREFIX, dist.TCPStore("127.0.0.1", port, is_master=False,
                                                       timeout=timedelta(seconds=300)))
    start_at = time.time() + 1.0
    for _ in workers:
        go.put(start_at)
    event_at = start_at + steady_seconds
    latencies: list[float] = []
    prober = threading.Thread(target=_probe, args=(port, event_at, latencies), daemon=True)
    prober.start()
    while time.time() < start_at + poll:
        time.sleep(0.05)
    cpu0, wall0 = _cpu_seconds(server.pid), time.time()
    while time.time() < event_at:
        time.sleep(0.01)
    cpu1, wall1 = _cpu_seconds(server.pid), time.time()
    # EventCoordinator.propose: compare_set, and with doorbells one multi_set of every rank's bell
    initiator.compare_set("ev/1/meta", "", json.dumps({"name": "stall-001", "reason": "stall", "initiator": 0}))
    rung_at = time.time()
    if mode == "doorbell":
        ring_every_rank(initiator, n, 1)
    ring_s = time.time() - rung_at
    merged: dict[int, dict] = {}
    for _ in workers:
        merged.update(out.get(timeout=steady_seconds + 300)["results"])
    for worker in workers:
        worker.join(30)
    prober.join(5)
    left = sum(1 for r in range(n) if initiator.check([f"bell/{r}"])) if mode == "doorbell" else 0
    stop.set()
    server.join(10)
    latencies.sort()
    seen = [r["seen_at"] for r in merged.values() if r["seen_at"] is not None]
    small = n * (60 + 8)  # announcement JSON + counter per rank
    ring_bytes = n * (len(PREFIX) + len("/bell/") + 6 + 1 + 8) if mode == "doorbell" else 0
    return {
        "ranks": n, "mode": mode, "connected": connected, "connect_s": connect_s,
        "server_cpu_pct": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
        "requests_per_s": sum(r["checks"] for r in merged.values()) / steady_seconds,
        "p50_ms": 1e3 * latencies[len(latencies) // 2] if latencies else float("nan"),
        "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)] if latencies else float("nan"),
        "fanout_s": (max(seen) - event_at) if len(seen) == n else float("nan"),
        "ring_s": ring_s, "bells_left": left,
        "clients_seen": len(seen),
        "event_bytes": n * blob_bytes + small + ring_bytes,
    }


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs) or 1.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var
    return slope, mean_y - slope * mean_x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="256,1024,4096,16384")
    parser.add_argument("--modes", default="poll,doorbell",
                        help="poll: a check per interval (event_doorbell false); doorbell: the default")
    parser.add_argument("--poll", type=float, default=0.5, help="the watchdog's poll_interval_seconds (default 0.5)")
    parser.add_argument("--blob-bytes", type=int, default=0,
                        help="bytes of each rank's gzip'd dump sent through the store (gather_through_store)")
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    rows = []
    for n in args.ranks.split(","):
        for mode in args.modes.split(","):
            rows.append(measure(int(n), mode, args.poll, args.blob_bytes, args.steady_seconds, args.processes))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    print(f"\nmachine: {os.cpu_count()} cores; poll {args.poll} s; blob {args.blob_bytes} B/rank; "
          f"{args.processes} client processes\n")
    print("| ranks | watchdog | store requests/s (steady, achieved) | server CPU (% of a core) | another client's check "
          "p50 / p99 (ms) | event reaches every rank (s) | ring (ms) | bells left | bytes per event |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['mode']} | {r['requests_per_s']:,.1f} | {r['server_cpu_pct']:.1f} | "
              f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} | {r['fanout_s']:.2f} ({r['clients_seen']}/{r['ranks']}) | "
              f"{1e3 * r['ring_s']:.0f} | {r['bells_left']} | {r['event_bytes']:,} |")
    for mode in args.modes.split(","):
        mine = [r for r in rows if r["mode"] == mode]
        if len(mine) < 2:
            continue
        xs = [float(r["ranks"]) for r in mine]
        cpu = _fit(xs, [r["server_cpu_pct"] for r in mine])
        fan = _fit(xs, [r["fanout_s"] for r in mine])
        for n in (16384, 65536):
            if n <= max(xs):
                continue
            print(f"{mode}: projected at {n}: server CPU {max(0.0, cpu[0] * n + cpu[1]):.1f} % of a core in steady "
                  f"state, event reaches every rank in {max(0.0, fan[0] * n + fan[1]):.2f} s (linear fits)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
