#!/usr/bin/env python
"""A whole stall event at 1,024, 4,096 and 16,384 simulated ranks on one real TCPStore: the
current protocol (``lightning_ncclx/events/``) and, side by side in the same run, the one before
it (re-implemented call for call in ``scale_old.py``: it is gone from the package).

One real torch ``TCPStore`` server (libuv) in its own process (its CPU and socket bytes read from
``/proc``); the simulated ranks in ``--processes`` client processes (``scale_ranks.py``), each
with the connections a real rank holds (the shared client and the doorbell's blocking ``wait``);
the initiator (rank 0) in this process runs the real ``gather_and_summarize`` (digest expansion,
the analyzer twice, the reports), ``close``, the outcome and the exit agreement. The job
(``scale_job.py``): 8 ranks per host, a default group and a tensor-parallel group per host, one
rank stuck in its data loader; every rank's digest is made from its files before the clock
starts. Per phase: wall time, store requests (counted by every client) and requests/s, the store
server's CPU (% of one core), payload bytes (keys and values) and socket bytes (the server's
read + written), then the keys left and the exit status each rank would take.

What is simulated, and what it costs here: 2 cores run the server, the analyzer and every rank's
Python (a real job spreads the ranks over N hosts), so the phases where all ranks act at once
(ring, announce, outcome) measure these 2 cores as much as the protocol.

    python bench/bench_event_scale.py                                  # 1024, 4096, 16384; both protocols
    python bench/bench_event_scale.py --ranks 1024 --protocols new     # one quick run
    python bench/bench_event_scale.py --ranks 4096 --protocols new --baseline HEAD   # against a commit

``--baseline REV``: before each size's own runs, the same size under the package and the bench
of commit ``REV`` (a ``git worktree`` under the temporary folder, run as its own process with
``PYTHONPATH`` on it), then a table of ratios: the initiator's own work, the time to
summary.json, the whole event, requests per rank per event and the estimate with each rank's
Python on its own host.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")  # the sandbox's resolver: ~0.2 s per connection

import scale_job  # noqa: E402
from scale_ranks import Counts, bench_config, client_process, raise_file_limit  # noqa: E402

from event_scale_report import phase_rows, print_baseline, print_size, print_summary  # noqa: E402

GOAL_SECONDS = 10.0
SAMPLE_SECONDS = 0.05


# ---------------------------------------------------------------------------------------- digests
def _digest_chunk(args: tuple[int, list[int], int, str]) -> list[tuple[int, bytes, bytes, float]]:
    from lightning_ncclx.dump.digest import make_digest
    from scale_old import old_digest

    world, ranks, steps, scratch = args
    out = []
    for rank in ranks:
        folder = Path(scratch) / str(rank)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        files = scale_job.write_rank(folder, rank, world, steps)
        written = time.perf_counter()
        new = make_digest(files)
        made = time.perf_counter() - written
        out.append((rank, new, old_digest(files), made))
        for path in files:
            path.unlink()
        folder.rmdir()
        del started
    return out


def digests(world: int, steps: int, work: Path) -> dict[int, tuple[bytes, bytes, float]]:
    """rank -> (digest, the old protocol's digest, seconds make_digest took), cached in ``work``."""
    cache = work / f"digests-{world}-{steps}.bin"
    if cache.exists():
        return _read_cache(cache)
    scratch = tempfile.mkdtemp(prefix="ncclx-digests-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    chunks = [(world, list(range(first, min(world, first + 256))), steps, scratch) for first in range(1, world, 256)]
    found: dict[int, tuple[bytes, bytes, float]] = {}
    with ProcessPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for part in pool.map(_digest_chunk, chunks):
            found.update({rank: (new, old, seconds) for rank, new, old, seconds in part})
    os.rmdir(scratch)
    work.mkdir(parents=True, exist_ok=True)
    with open(cache, "wb") as handle:
        for rank, (new, old, seconds) in sorted(found.items()):
            handle.write(struct.pack("<IIId", rank, len(new), len(old), seconds) + new + old)
    return found


def _read_cache(path: Path) -> dict[int, tuple[bytes, bytes, float]]:
    data, out, at = path.read_bytes(), {}, 0
    head = struct.calcsize("<IIId")
    while at < len(data):
        rank, n_new, n_old, seconds = struct.unpack_from("<IIId", data, at)
        at += head
        out[rank] = (data[at:at + n_new], data[at + n_new:at + n_new + n_old], seconds)
        at += n_new + n_old
    return out


# ---------------------------------------------------------------------------------------- the server
def _server(port_queue: Any, stop: Any) -> None:
    import torch.distributed as dist

    raise_file_limit()
    import resource

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                          timeout=timedelta(seconds=600))
    port_queue.put((store.port, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    stop.wait()


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_io(pid: int) -> int:
    with open(f"/proc/{pid}/io") as handle:
        values = dict(line.split(":") for line in handle)
    return int(values["rchar"]) + int(values["wchar"])


class Sampler:
    """Every 50 ms: the server's CPU seconds and socket bytes, the clients' CPU seconds (``/proc``
    counts CPU in 10 ms ticks: a phase's CPU share is over the samples around it)."""

    def __init__(self, server: int, clients: list[int]) -> None:
        self.server, self.clients = server, clients
        self.samples: list[tuple[float, float, int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), _proc_cpu(self.server), _proc_io(self.server),
                                     sum(_proc_cpu(pid) for pid in self.clients)))
            except (OSError, ValueError):
                pass
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(2)

    def between(self, start: float, end: float) -> tuple[float, int, float]:
        """(server CPU seconds, server socket bytes, client CPU seconds) from ``start`` to ``end``."""
        before = [s for s in self.samples if s[0] <= start]
        after = [s for s in self.samples if s[0] >= end]
        if not before or not after:
            return 0.0, 0, 0.0
        first, last = before[-1], after[0]
        return last[1] - first[1], last[2] - first[2], last[3] - first[3]

    def span(self, start: float, end: float) -> float:
        """The time the samples around ``start`` and ``end`` cover (the CPU figures' denominator)."""
        before = [s[0] for s in self.samples if s[0] <= start]
        after = [s[0] for s in self.samples if s[0] >= end]
        return (after[0] - before[-1]) if before and after else 0.0


# ---------------------------------------------------------------------------------------- one run
class Marks:
    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = [("start", time.time())]

    def __call__(self, name: str) -> None:
        self.times.append((name, time.time()))

    def phases(self) -> list[tuple[str, float, float]]:
        return [(name, self.times[i][1], end) for i, (name, end) in enumerate(self.times[1:])]


def measure(world: int, protocol: str, found: dict, args: argparse.Namespace, local_work: dict[str, float]) -> dict:
    ctx = mp.get_context("spawn")
    port_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(port_queue, stop), daemon=True)
    server.start()
    port, files_limit = port_queue.get(timeout=120)
    epoch = time.time()
    ready, out = ctx.Queue(), ctx.Queue()
    processes, commands = [], []
    connect_started = time.time()
    sharing = args.ranks_per_connection or (1 if 2 * world + 256 < files_limit else scale_job.RANKS_PER_HOST)
    for index in range(args.processes):
        ranks = [r for r in range(1, world) if (r // scale_job.RANKS_PER_HOST) % args.processes == index]
        slice_ = {r: (found[r][0] if protocol == "new" else found[r][1], found[r][2]) for r in ranks}
        command = ctx.Queue()
        process = ctx.Process(target=client_process, args=(port, ranks, world, protocol, args.steps, epoch, slice_,
                                                           sharing, ready, command, out), daemon=True)
        process.start()
        processes.append(process)
        commands.append(command)
    arrived = [ready.get(timeout=1800) for _ in processes]
    connect_seconds = time.time() - connect_started
    counts = Counts(epoch)
    marks = Marks()
    with tempfile.TemporaryDirectory(prefix="ncclx-event-scale-", dir=args.dump_parent) as dump_dir:
        with Sampler(server.pid, [p.pid for p in processes]) as sampler:
            if protocol == "new":
                from event_scale_initiator import run_new

                outcome = run_new(port, world, counts, Path(dump_dir), args.steps, marks, args.cap_seconds)
            else:
                from event_scale_initiator import run_old

                outcome = run_old(port, world, counts, marks, local_work, args.cap_seconds)
            settle = time.time() + 10.0
            while time.time() < settle and not outcome.get("all_left", True):
                time.sleep(0.1)
            time.sleep(0.5)
            for command in commands:
                command.put("report")
            reports = [out.get(timeout=600) for _ in processes]
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
    keys = _keys_left(port)
    stop.set()
    server.join(10)
    table: Counter = Counter(counts.table)
    results: dict[int, dict] = {}
    for report in reports:
        table.update(report["counts"])
        results.update(report["results"])
    phases = marks.phases()
    ends = {name: end for name, _, end in phases}
    server_cpu = {"event": sampler.between(phases[0][1], phases[-1][2])[0],
                  "to_summary": sampler.between(phases[0][1], ends.get("summary", phases[-1][2]))[0],
                  "ring_announce": sampler.between(phases[0][1], ends.get("announce", phases[0][2]))[0]}
    return {"ranks": world, "protocol": protocol, "connect_seconds": connect_seconds, "server_cpu_seconds": server_cpu,
            "ranks_per_connection": sharing, "server_files_limit": files_limit,
            "phases": phase_rows(phases, table, sampler, epoch), "keys_left": keys,
            "exit_status": _exit_status(results, outcome), "outcome": outcome,
            "digest_bytes": _announcement_bytes(found, protocol),
            "digest_make_ms": 1e3 * _mean(found[r][2] for r in found),
            "errors": sum((Counter(r["errors"]) for r in results.values()), Counter()).most_common(5),
            "clients_ready": sum(a["ranks"] for a in arrived)}


def _announcement_bytes(found: dict, protocol: str) -> float:
    """What one rank sets for its announcement and digest (the mean over up to 256 ranks)."""
    from lightning_ncclx.events.wire import Announcement
    from scale_ranks import FOLDER

    sizes = []
    for rank in sorted(found)[:256]:
        names = tuple(p.name for p in scale_job.files_of(Path(FOLDER), rank))
        if protocol == "new":
            sizes.append(len(Announcement(rank, scale_job.host_of(rank), names, FOLDER, found[rank][0]).encode()))
        else:
            sizes.append(len(found[rank][1]) + len(json.dumps({"host": scale_job.host_of(rank), "files": names,
                                                               "folder": FOLDER})))
    return _mean(sizes)


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _exit_status(results: dict[int, dict], outcome: dict) -> dict:
    statuses: Counter = Counter()
    for result in results.values():
        statuses[f"{result['code']} ({result['note']})" if result["code"] is not None else result["note"]] += 1
    if outcome.get("initiator_code") is not None:
        statuses[f"{outcome['initiator_code']} (initiator)"] += 1
    return dict(statuses.most_common())


def _keys_left(port: int) -> dict[str, int]:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    left: Counter = Counter()
    for key in store.list_keys():
        parts = key.split("/")
        if len(parts) > 1 and parts[1] == "ev":
            pattern = "/".join(parts[:3] + [parts[3] if len(parts) > 3 else ""]).rstrip("/")
        else:
            pattern = "/".join(parts[:2])
        left[pattern] += 1
    return dict(left)


# ---------------------------------------------------------------------------------------- baseline
REPO = Path(__file__).resolve().parents[1]


def baseline_tree(rev: str) -> tuple[str, Path]:
    """(commit, a worktree of it under the temporary folder), made once per commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"ncclx-baseline-{commit[:12]}"
    if not (tree / "bench" / "bench_event_scale.py").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(tree), commit],
                       check=True, capture_output=True)
    return commit, tree


def run_baseline(commit: str, tree: Path, world: int, args: argparse.Namespace) -> list[dict]:
    """The baseline's own bench at ``world`` ranks (new protocol), its rows as the baseline's.
    Its digests are this run's cached ones where ``dump/digest.py`` is the same at that commit."""
    same_digest = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", commit, "--",
                                  "lightning_ncclx/dump/digest.py"]).returncode == 0
    work = Path(args.work) if same_digest else Path(args.work) / f"baseline-{commit[:12]}"
    out = Path(tempfile.mkstemp(prefix="ncclx-baseline-", suffix=".json")[1])
    command = [sys.executable, str(tree / "bench" / "bench_event_scale.py"), "--ranks", str(world), "--protocols", "new",
               "--processes", str(args.processes), "--steps", str(args.steps), "--ranks-per-connection",
               str(args.ranks_per_connection), "--cap-seconds", str(args.cap_seconds), "--work", str(work),
               "--json", str(out)] + (["--dump-parent", args.dump_parent] if args.dump_parent else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    print(f"\n{world} ranks, baseline {commit[:12]} ({tree}):", flush=True)
    subprocess.run(command, check=True, cwd=tree, env=env)
    rows = json.loads(out.read_text())
    out.unlink()
    for row in rows:
        row["protocol"] = f"baseline {commit[:12]}"
    return rows


# ---------------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--protocols", default="new,old")
    parser.add_argument("--processes", type=int, default=8, help="client processes holding the simulated ranks")
    parser.add_argument("--steps", type=int, default=24, help="training steps in each rank's flight recorder")
    parser.add_argument("--ranks-per-connection", type=int, default=0,
                        help="simulated ranks sharing one request connection (0: 1, or the 8 of a host where the "
                             "store server cannot hold 2 connections per rank)")
    parser.add_argument("--cap-seconds", type=float, default=240.0, help="a run stops after this long")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "ncclx-bench-event-scale"),
                        help="cached digests of the simulated jobs")
    parser.add_argument("--dump-parent", default=None, help="where the initiator's dump folder is made")
    parser.add_argument("--json", help="write every row here too")
    parser.add_argument("--baseline", metavar="REV", help="also run each size under the package and bench of this "
                        "git commit (e.g. HEAD), in the same invocation, and print the ratios")
    args = parser.parse_args()
    base = baseline_tree(args.baseline) if args.baseline else None
    raise_file_limit()
    rows = []
    print(f"{time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"{args.processes} client processes; exit status of the scenario's kind: "
          f"{bench_config().exit_codes['stuck_outside_collective']} (75: a rank that never heard the outcome)",
          flush=True)
    for world in (int(n) for n in args.ranks.split(",")):
        started = time.time()
        found = digests(world, args.steps, Path(args.work))
        print(f"\n{world} ranks: digests ready in {time.time() - started:.0f} s", flush=True)
        local_work: dict[str, float] = {}
        if base is not None:
            rows += run_baseline(base[0], base[1], world, args)
        for protocol in args.protocols.split(","):
            row = measure(world, protocol, found, args, local_work)
            if protocol == "new":
                done = row["outcome"]
                local_work = dict(done.get("local_work", {}), want=done.get("want", []), code=done.get("initiator_code"),
                                  kind=done.get("kind"))
            rows.append(row)
            print_size(row)
    print_summary([r for r in rows if not r["protocol"].startswith("baseline")], GOAL_SECONDS)
    if base is not None:
        print_baseline(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
