"""The event doorbell on a real torch ``TCPStore``: one open ``wait`` per rank instead of a
``check`` per poll; a ring wakes the listener, which deletes its bell; stop, stale stop tokens, a
lost server; which stores get a doorbell; and two watchdogs in one process, where the second
learns of the first's on-demand event only from its bell."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
import torch.distributed as dist

from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.events import doorbell as doorbell_module
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.doorbell import Doorbell, ring_every_rank
from lightning_ncclx.events.keys import STORE_PREFIX, bell_key
from lightning_ncclx.watchdog import runtime as runtime_module
from lightning_ncclx.watchdog.heartbeat import Phase
from lightning_ncclx.watchdog.runtime import WatchdogRuntime


@pytest.fixture
def server() -> Any:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                          timeout=timedelta(seconds=30))
    yield store
    del store


def client(server: Any) -> Any:
    raw = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    return dist.PrefixStore(STORE_PREFIX, raw)


def until(condition: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def start_listening(server: Any, rank: int, rings: list[int]) -> tuple[Doorbell, Any]:
    job = client(server)
    bell = Doorbell.for_store(server, StoreClient(job), rank, on_ring=lambda: rings.append(rank))
    assert bell is not None
    bell.start()
    assert until(lambda: bell.listening)
    return bell, job


def test_a_ring_wakes_the_listener_and_its_bell_is_deleted(server: Any) -> None:
    rings: list[int] = []
    bell, job = start_listening(server, 3, rings)
    try:
        assert not bell.take()
        ring_every_rank(job, 4, event_number=1)
        assert until(lambda: rings == [3])
        assert bell.take() and not bell.take()  # taken once
        assert until(lambda: not job.check([bell_key(3)]))  # the listener deleted its own bell
        assert [job.check([bell_key(r)]) for r in range(3)] == [True, True, True]  # nobody listens there
        assert bell.listening and bell.rings == 1
    finally:
        bell.stop()


def test_stop_ends_the_thread_and_leaves_no_key(server: Any) -> None:
    rings: list[int] = []
    bell, job = start_listening(server, 0, rings)
    bell.stop()
    assert not bell.listening
    assert rings == [] and bell.rings == 0
    assert not job.check([bell_key(0)])
    assert "ncclx-doorbell-rank0" not in [t.name for t in threading.enumerate()]


def test_a_stop_that_lands_between_two_waits_leaves_no_key(server: Any) -> None:
    """The listener deletes a ring's bell, and before it looks at the stop flag the owner stops:
    flag set, own bell rung. The listener returns without another wait, so the stop's bell is
    never taken by it; ``stop`` deletes it (a clean-clone run found ``bell/1`` left after a fit)."""
    job = client(server)
    stopping, holding = threading.Event(), threading.Event()

    class HeldAfterDelete:
        """The listener's real connection; its delete of a ring's bell returns only once the stop
        rang (the moment between the delete and the flag's check)."""

        def __init__(self) -> None:
            self.store = client(server)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.store, name)

        def delete_key(self, key: str) -> bool:
            deleted = self.store.delete_key(key)
            if stopping.is_set():
                holding.set()
                until(lambda: job.check([key]), 5.0)
            return deleted

    bell = Doorbell(HeldAfterDelete, StoreClient(job), 2, on_ring=lambda: None)
    bell.start()
    assert until(lambda: bell.listening)
    stopping.set()
    ring_every_rank(job, 3, event_number=1)  # wakes the listener; it then waits in the delete above
    assert holding.wait(20.0)
    bell.stop()
    assert not bell.listening
    assert not job.check([bell_key(2)])


def test_an_earlier_listeners_stop_token_is_one_ring_not_a_stop(server: Any) -> None:
    rings: list[int] = []
    job = client(server)
    job.set(bell_key(1), "stop:left-by-an-earlier-watchdog")
    bell, _ = start_listening(server, 1, rings)
    try:
        assert until(lambda: rings == [1])
        assert bell.listening  # still waiting for the next ring
        ring_every_rank(job, 2, event_number=2)
        assert until(lambda: rings == [1, 1])
    finally:
        bell.stop()


def test_a_lost_server_turns_the_listener_off_and_wakes_its_owner() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                           timeout=timedelta(seconds=30))
    rings: list[int] = []
    bell, _ = start_listening(server, 2, rings)
    assert until(lambda: bell.listening)
    del server  # the store's host goes away
    assert until(lambda: not bell.listening)
    assert rings == [2]  # the owner is woken, to poll instead
    bell.stop()


def test_a_wait_that_runs_its_course_is_renewed(server: Any, monkeypatch) -> None:
    rings: list[int] = []
    job = client(server)
    address = StoreAddress.of(server)
    bell = Doorbell(address.connect, StoreClient(job), 5, on_ring=lambda: rings.append(5), wait_seconds=0.3)
    bell.start()
    try:
        time.sleep(0.8)  # two waits run out
        assert bell.listening and rings == []
        ring_every_rank(job, 6, event_number=1)
        assert until(lambda: rings == [5])
    finally:
        bell.stop()


def test_only_a_tcp_store_gets_a_listening_connection(server: Any, tmp_path: Path) -> None:
    def bell(store: Any) -> Doorbell | None:
        return Doorbell.for_store(store, StoreClient(dist.HashStore()), 0, on_ring=lambda: None)

    assert bell(dist.PrefixStore(STORE_PREFIX, dist.HashStore())) is None
    assert bell(dist.FileStore(str(tmp_path / "store"), 1)) is None
    nested = dist.PrefixStore("default_pg", dist.TCPStore("127.0.0.1", server.port, is_master=False))
    address = StoreAddress.of(nested)
    assert address is not None and bell(nested) is not None
    listen = address.connect()
    client(server).set("same-key", "seen")
    assert listen.get("same-key") == b"seen"  # the plugin's namespace at the server's root, another connection


def test_only_the_rank_that_starts_an_event_rings(server: Any) -> None:
    first = EventCoordinator(StoreClient(client(server)), 0, 3)
    second = EventCoordinator(StoreClient(client(server)), 1, 3)
    first.rings_doorbells = second.rings_doorbells = True
    event = first.propose("stall")
    assert event.initiator == 0
    store = client(server)
    assert [store.get(bell_key(r)) for r in range(3)] == [b"1:start"] * 3
    for r in range(3):
        store.delete_key(bell_key(r))
    second.last_seen = 0
    joined = second.propose("stall")  # too late: it joins event 1 and rings nobody
    assert joined.initiator == 0
    assert [store.check([bell_key(r)]) for r in range(3)] == [False, False, False]


def test_without_doorbells_propose_rings_nobody(server: Any) -> None:
    coordinator = EventCoordinator(StoreClient(client(server)), 0, 2)
    coordinator.propose("stall")
    assert not client(server).check([bell_key(0)])


def test_a_second_rank_learns_of_an_event_from_its_bell_only(server: Any, tmp_path: Path, monkeypatch) -> None:
    stores = {rank: client(server) for rank in (0, 1)}
    identities = iter([(0, 2, stores[0]), (1, 2, stores[1])])
    monkeypatch.setattr(runtime_module, "_job_identity", lambda: next(identities))
    config = WatchdogConfig(poll_interval_seconds=0.05, on_stall=StallAction.dump, on_demand_signal=None,
                            native_stacks=False, collect_timeout_seconds=10.0, auto={"enabled": False},
                            consensus={"enabled": False})
    runtimes = [WatchdogRuntime(config, tmp_path / f"rank{rank}") for rank in (0, 1)]
    polls = [0, 0]
    for rank, runtime in enumerate(runtimes):
        original = runtime.coordinator.poll

        def counted(rank: int = rank, original: Any = original) -> Any:
            polls[rank] += 1
            return original()

        monkeypatch.setattr(runtime.coordinator, "poll", counted)
        runtime.heartbeat.beat(Phase.idle)
    try:
        for runtime in runtimes:
            runtime.start()
        assert all(r.doorbell is not None and r.coordinator.rings_doorbells for r in runtimes)
        assert until(lambda: all(r.listening() for r in runtimes) and min(polls) >= 1)
        time.sleep(0.2)  # the tick that saw the listener come up
        before = list(polls)
        time.sleep(1.0)  # 20 poll intervals of steady state
        assert polls == before  # then nothing until a ring
        (tmp_path / "rank0").mkdir(exist_ok=True)
        (tmp_path / "rank0" / "DUMP_NOW").touch()  # rank 0 starts an on-demand event
        folder = tmp_path / "rank1" / "ondemand-001"
        # (without a process group, both in-process ranks name their files as rank 0)
        assert until(lambda: folder.is_dir() and any(p.suffix == ".json" for p in folder.iterdir()), 60.0)
        assert runtimes[1].doorbell.rings == 1
        assert until(lambda: (tmp_path / "rank0" / "ondemand-001" / "summary.json").is_file(), 60.0)
    finally:
        for runtime in runtimes:
            runtime.stop()
    assert not any(t.name.startswith("ncclx-doorbell") for t in threading.enumerate())
    assert [stores[0].check([bell_key(r)]) for r in (0, 1)] == [False, False]


def test_a_ring_sets_every_bell_in_requests_of_at_most_ring_chunk_keys(server: Any) -> None:
    world = 2 * doorbell_module.RING_CHUNK + 3
    sent: list[int] = []

    class Recording:
        """The real store, with the size of each multi_set written down."""

        def __init__(self, store: Any) -> None:
            self.store = store

        def multi_set(self, keys: list[str], values: list[str]) -> None:
            sent.append(len(keys))
            self.store.multi_set(keys, values)

    job = client(server)
    ring_every_rank(Recording(job), world, event_number=4)
    assert sent == [doorbell_module.RING_CHUNK, doorbell_module.RING_CHUNK, 3]
    assert job.multi_get([bell_key(r) for r in range(world)]) == [b"4"] * world
