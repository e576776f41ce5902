"""Simulated ranks for ``bench_event_scale.py``: one client process holds many of them.

Each simulated rank of the current protocol has what a real rank has: its shared
:class:`~lightning_ncclx.events.connection.StoreClient` (one connection), a real
:class:`~lightning_ncclx.events.doorbell.Doorbell` (a thread blocked in ``wait`` on a connection
of its own) and an :class:`~lightning_ncclx.events.coordinator.EventCoordinator`. On each ring
it does what ``WatchdogRuntime._tick`` and ``EventParticipation`` do for a rank that did not
start the event (``follow``, then ``poll``; ``take_part``: announce with the digest, check the
host's processes; serve ``want`` with ``upload_full``; read the outcome twice, say it leaves),
on the doorbell's thread (a ring that lands meanwhile sets the bell again: none is lost). The
watchdog thread's own tick (every ``poll_interval_seconds``) is one thread per process.

What is simulated: the dump itself (each rank's files are made from ``scale_job`` when needed;
its digest was made before the clock started, and the rank sleeps as long as making it took);
the heartbeat (every rank is stuck, so it obeys the exit order at once); the process exit (the
exit status is recorded). Every store request goes through :class:`CountingStore`, a real
connection that counts requests and payload bytes per 5 ms.
"""

from __future__ import annotations

import os
import resource
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.config import HANG_KINDS, WatchdogConfig
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.doorbell import Doorbell
from lightning_ncclx.events.liveness import ProcessInfo
from lightning_ncclx.events.wire import Announcement, EventMeta
from lightning_ncclx.watchdog.participation import EXIT_WAIT_MARGIN_SECONDS, scaled

import scale_job

BUCKET_SECONDS = 0.005
CONNECT_BATCH = 64
FOLDER = "/scratch/run/ncclx_dumps/stall-001"
"""Where every simulated rank says its dump is (on its own host)."""


class Counts:
    """Requests and payload bytes per (5 ms bucket, operation), for one process."""

    def __init__(self, epoch: float) -> None:
        self.epoch = epoch
        self.table: Counter = Counter()
        self.errors: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, op: str, nbytes: int, dump_bytes: int = 0) -> None:
        bucket = int((time.time() - self.epoch) / BUCKET_SECONDS)
        with self._lock:
            self.table[(bucket, op, "n")] += 1
            self.table[(bucket, op, "bytes")] += nbytes
            if dump_bytes:
                self.table[(bucket, op, "dump_bytes")] += dump_bytes


def is_dump_key(key: str) -> bool:
    """A rank's announcement with its digest, or its full dump (the old protocol's digest too)."""
    return "/rank/" in key or "/blob/" in key or "/digest/" in key


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (bytes, str)) else 0


class CountingStore:
    """A real store connection; every request is counted with its key and value bytes."""

    def __init__(self, store: Any, counts: Counts) -> None:
        self._store, self._counts = store, counts

    def _count(self, op: str, nbytes: int, result: Any = None) -> Any:
        self._counts.add(op, nbytes + (sum(map(_size, result)) if isinstance(result, list) else _size(result)))
        return result

    def set(self, key: str, value: Any) -> None:
        self._store.set(key, value)
        self._counts.add("set", len(key) + _size(value), _size(value) if is_dump_key(key) else 0)

    def get(self, key: str) -> bytes:
        return self._count("get", len(key), self._store.get(key))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._count("compare_set", len(key) + _size(expected) + _size(desired),
                           self._store.compare_set(key, expected, desired))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._count("multi_get", sum(map(len, keys)), self._store.multi_get(keys))

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._store.multi_set(keys, values)
        dumps = sum(_size(v) for k, v in zip(keys, values) if is_dump_key(k))
        self._counts.add("multi_set", sum(map(len, keys)) + sum(map(_size, values)), dumps)

    def add(self, key: str, amount: int) -> int:
        return self._count("add", len(key) + 8, self._store.add(key, amount))

    def append(self, key: str, value: Any) -> None:
        self._store.append(key, value)
        self._count("append", len(key) + _size(value))

    def check(self, keys: list[str]) -> bool:
        return self._count("check", sum(map(len, keys)), self._store.check(keys))

    def delete_key(self, key: str) -> bool:
        return self._count("delete_key", len(key), self._store.delete_key(key))

    def wait(self, keys: list[str], *timeout: Any) -> None:
        self._count("wait", sum(map(len, keys)))
        self._store.wait(keys, *timeout)

    def set_timeout(self, timeout: Any) -> None:
        self._store.set_timeout(timeout)


def start_ticks() -> int:
    with open("/proc/self/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19])


def process_info(rank: int) -> ProcessInfo:
    host = scale_job.host_of(rank)
    return ProcessInfo(rank, host, os.getpid(), start_ticks(), f"bench-{host}")


class Scratch:
    """Where a wanted rank's full dump is made from ``scale_job`` just before it is packed."""

    def __init__(self, world: int, steps: int) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.folder = Path(tempfile.mkdtemp(prefix="ncclx-event-scale-", dir=base))
        self.world, self.steps = world, steps

    def files(self, rank: int) -> list[Path]:
        folder = self.folder / str(rank)
        folder.mkdir(parents=True, exist_ok=True)
        return scale_job.write_rank(folder, rank, self.world, self.steps)


class NewRank:
    """A rank that did not start the event, under the current protocol."""

    def __init__(self, rank: int, world: int, address: StoreAddress, counts: Counts, config: WatchdogConfig,
                 digest: bytes, digest_seconds: float, files: Callable[[int], list[Path]],
                 client: StoreClient | None = None) -> None:
        """``client``: a request connection shared with other simulated ranks (None: one of its own)."""
        self.rank, self.world, self.config = rank, world, config
        self.digest, self.digest_seconds, self._files = digest, digest_seconds, files

        def opener() -> CountingStore:
            return CountingStore(address.connect(), counts)

        self.client = client or StoreClient(opener=opener, op_timeout_seconds=config.poll_interval_seconds,
                                            bounded=False)  # one request thread per simulated rank: see StoreClient
        self.coordinator = EventCoordinator(self.client, rank, world, stale_after_seconds=scaled(
            config.collect_timeout_seconds + 2 * EXIT_WAIT_MARGIN_SECONDS, world))
        self.coordinator.rings_doorbells = True
        self.doorbell = Doorbell(opener, self.client, rank, on_ring=self._on_ring)
        self.lock = threading.Lock()
        self.poll_again = True
        self.event: EventMeta | None = None
        self.awaiting_want = False
        self.exit_order: Any = None
        self.code: int | None = None
        self.left_at: float | None = None
        self.errors: Counter = Counter()

    def arm(self) -> None:
        """``WatchdogRuntime._ensure_armed``: skip earlier events, register the process."""
        self.coordinator.skip_past_events()
        self.coordinator.register_process(process_info(self.rank))
        self.poll_again = False

    def _on_ring(self) -> None:
        with self.lock:
            self.tick(rung=self.doorbell.take())

    def tick(self, rung: bool) -> None:
        """``WatchdogRuntime._tick``: follow the open event, then poll for the next one."""
        try:
            self._follow(rung)
            if self.poll_again or rung or not self.doorbell.listening:
                event = self.coordinator.poll()
                self.poll_again = event is not None
                if event is not None:
                    self._take_part(event)
        except Exception as error:  # noqa: BLE001 - the real watchdog logs it and goes on at the next tick
            self.errors[f"{type(error).__name__}: {str(error).splitlines()[0][:60] if str(error) else ''}"] += 1

    def _take_part(self, event: EventMeta) -> None:
        """``EventParticipation.take_part`` (two-phase, ``dump_and_exit``), after the dump."""
        time.sleep(self.digest_seconds)
        names = tuple(p.name for p in scale_job.files_of(Path(FOLDER), self.rank))
        announcement = Announcement(self.rank, scale_job.host_of(self.rank), names, FOLDER, self.digest)
        self.coordinator.announce(event, announcement, None)
        self.coordinator.check_local_peers(event)
        self.event, self.awaiting_want = event, True
        self._follow(not self.doorbell.listening)

    def _follow(self, rung: bool) -> None:
        """``EventParticipation._follow_one`` for a rank that did not start the event."""
        if self.event is None or self.code is not None:
            return
        if not rung and self.exit_order is None:
            return
        if self.awaiting_want:
            self._serve_want()
        if self.exit_order is None:
            self.exit_order = self.coordinator.outcome(self.event, self._allowed(), HANG_KINDS)
        if self.exit_order is not None and self.exit_order.exit:
            latest = self.coordinator.outcome(self.event, self._allowed(), HANG_KINDS)
            order = latest if latest is not None and latest.exit else self.exit_order
            self.coordinator.launcher_parent()  # WatchdogRuntime.leave
            self.coordinator.leaving(self.event, timeout_seconds=scaled(5.0, self.world))
            self.code, self.left_at = int(order.code), time.time()

    def _serve_want(self) -> None:
        wanted = self.coordinator.wanted(self.event)
        if wanted is None:
            if self.coordinator.is_closed(self.event):
                self.awaiting_want = False
            return
        self.awaiting_want = False
        if self.rank in wanted:
            self.coordinator.upload_full(self.event, self._files(self.rank))

    def _allowed(self) -> set[int]:
        return {self.config.exit_code, *self.config.exit_codes.values()}


def raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 65536), max(hard, 65536)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def ticker(ranks: list[NewRank], interval: float, stop: threading.Event) -> None:
    """The watchdog threads' own ticks: a rank whose ``_poll_again`` is set polls once more."""
    while not stop.wait(interval):
        for rank in ranks:
            if rank.poll_again and rank.lock.acquire(blocking=False):
                try:
                    rank.tick(rung=False)
                finally:
                    rank.lock.release()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def client_process(port: int, ranks: list[int], world: int, protocol: str, steps: int, epoch: float,
                   digests: dict[int, tuple[bytes, float]], sharing: int, ready: Any, commands: Any, out: Any) -> None:
    """One process of simulated ranks: connect them all, say ready, run until told to report.
    ``sharing``: simulated ranks per request connection (each keeps its own doorbell's)."""
    import torch.distributed as dist  # noqa: F401 - loaded before the threads start

    raise_file_limit()
    threading.stack_size(512 * 1024)
    counts = Counts(epoch)
    scratch = Scratch(world, steps)
    address = StoreAddress("127.0.0.1", port)
    config = bench_config()
    started = time.time()
    if protocol == "new":
        shared: dict[int, StoreClient] = {}

        def client_of(rank: int) -> StoreClient | None:
            if sharing <= 1:
                return None
            group = rank // sharing
            if group not in shared:
                shared[group] = StoreClient(opener=lambda: CountingStore(address.connect(), counts),
                                            op_timeout_seconds=config.poll_interval_seconds, bounded=False)
            return shared[group]

        sims: list[Any] = [NewRank(r, world, address, counts, config, digests[r][0], digests[r][1], scratch.files,
                                   client_of(r)) for r in ranks]
        for first in range(0, len(sims), CONNECT_BATCH):  # a few connections at a time: no connect storm
            batch = sims[first:first + CONNECT_BATCH]
            for sim in batch:
                sim.arm()
                sim.doorbell.start()
            while not all(sim.doorbell.listening for sim in batch) and time.time() - started < 1800:
                time.sleep(0.01)
        stop = threading.Event()
        threading.Thread(target=ticker, args=(sims, config.poll_interval_seconds, stop), daemon=True).start()
    else:
        from scale_old import OldRank
        from lightning_ncclx.events.packing import pack_files

        sims = []
        stores: dict[int, CountingStore] = {}
        for r in ranks:
            info = process_info(r)
            group = r // max(1, sharing) if sharing > 1 else r
            if group not in stores:
                stores[group] = CountingStore(address.connect(), counts)
            store = stores[group]
            store.append(f"procs/{info.scope}", info.to_json() + "\n")
            sims.append(OldRank(r, world, store, CountingStore(address.connect(), counts), info.host, info.scope,
                                digests[r][0], lambda rank=r: scratch.files(rank), pack_files))
        for sim in sims:
            sim.thread.start()
        time.sleep(1.0)  # every thread in its wait
    ready.put({"ranks": len(ranks), "connect_seconds": time.time() - started, "cpu": _cpu_seconds()})
    commands.get()
    results = {}
    for sim in sims:
        if protocol == "new":
            results[sim.rank] = {"code": sim.code, "errors": dict(sim.errors),
                                 "note": "outcome" if sim.code is not None else "no outcome yet"}
        else:
            results[sim.rank] = {"code": sim.code, "errors": {}, "note": sim.note}
    out.put({"results": results, "counts": dict(counts.table), "cpu": _cpu_seconds()})
    out.close()
    out.join_thread()
    os._exit(0)  # threads still blocked in a store wait: no interpreter teardown under them


def bench_config() -> WatchdogConfig:
    """The defaults, with ``dump_and_exit`` and the scenario's kind on its own exit status (78),
    so that a rank leaving with 75 is one that did not hear the outcome."""
    from lightning_ncclx.config import DEFAULT_EXIT_CODES, StallAction

    return WatchdogConfig(on_stall=StallAction.dump_and_exit,
                          exit_codes=dict(DEFAULT_EXIT_CODES, stuck_outside_collective=78))
