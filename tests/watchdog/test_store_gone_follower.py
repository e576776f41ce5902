"""A rank following a ``dump_and_exit`` event on another host than the summarizing rank, when
the job's store dies with its host process (rank 0, the summarizing rank, killed): no outcome,
no pulse and no gone roster can be read any more, and no ``/proc`` of that host is this rank's
to read. A real ``TCPStore`` server, really stopped; a real heartbeat on a clock moved by hand."""

from __future__ import annotations

import gc
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch.distributed as dist

from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.wire import EventMeta
from lightning_ncclx.watchdog.heartbeat import Heartbeat
from lightning_ncclx.watchdog.participation import EventParticipation, OpenEvent
from support import FakeClock

WORLD = 3
BAR = 5.0
EXIT_CODE = 75
EVENT = EventMeta.new(1, "stall", 0, time.time())


class Follower:
    """Rank 2 following event 1 of initiator rank 0 (the store's host), stuck since its heartbeat."""

    def __init__(self, port: int, *, moving: bool = False) -> None:
        self.clock = FakeClock(100.0)
        self.moving = moving
        config = WatchdogConfig(train_step_seconds=BAR, first_step_seconds=BAR, auto={"enabled": False},
                                on_stall=StallAction.dump_and_exit, exit_code=EXIT_CODE)
        self.heartbeat = Heartbeat(config, clock=self.clock)
        self.heartbeat.train_batch_start()
        client = StoreClient(opener=StoreAddress("127.0.0.1", port).connect, op_timeout_seconds=0.5,
                             clock=self.clock)
        self.coordinator = EventCoordinator(client, 2, WORLD)
        self.coordinator.local_process_gone = lambda rank: False  # another host: no /proc to read
        self.exits: list[tuple[str, int]] = []
        runtime = SimpleNamespace(
            rank=2, world_size=WORLD, config=config, coordinator=self.coordinator, heartbeat=self.heartbeat,
            clock=self.clock, listening=lambda: False, allowed_exit_codes=lambda: {EXIT_CODE, 76, 77},
            take_over_alerts=lambda opened: None, report_kind=lambda *args: None,
            exit_job=lambda event, code: self.exits.append((event.name, code)))
        self.participation = EventParticipation(runtime)  # type: ignore[arg-type]
        beat = self.heartbeat.last
        opened = OpenEvent(EVENT, False, beat.seq, beat.time, True, [])
        opened.give_up_at = self.participation._give_up_at(opened)
        self.opened = opened
        self.participation.open[EVENT.number] = opened

    def follow_for(self, seconds: float) -> float | None:
        """Tick once a second; the clock's reading when this rank left, or None."""
        for _ in range(int(seconds)):
            self.clock.advance(1.0)
            if self.moving:
                self.heartbeat.train_batch_start()
            self.participation.follow()
            if self.exits:
                return self.clock()
        return None


def _server() -> Any:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def test_a_stuck_rank_leaves_at_its_own_bar_once_the_store_is_gone_not_after_the_give_up_window() -> None:
    server = _server()
    follower = Follower(server.port)
    assert follower.follow_for(2) is None  # the store is there: no word yet, not stuck past the bar
    del server
    gc.collect()
    left_at = follower.follow_for(follower.opened.give_up_at - follower.clock() + 5)
    assert follower.exits == [(EVENT.name, EXIT_CODE)]
    assert left_at is not None and left_at < follower.opened.give_up_at
    assert left_at - follower.opened.beat_time >= BAR  # never before its own evidence says it is stuck
    assert follower.opened.store_gone and "connection refused" in follower.opened.store_gone


def test_a_rank_that_moves_never_leaves_whatever_happened_to_the_store() -> None:
    server = _server()
    follower = Follower(server.port, moving=True)
    del server
    gc.collect()
    assert follower.follow_for(follower.opened.give_up_at - follower.clock() + 5) is None
    assert follower.exits == []


def test_a_store_that_only_stops_answering_is_not_taken_for_gone() -> None:
    """A store that is slow or unreachable (not refused) may come back: the rank waits for the
    event's word up to its give-up window, as before."""
    server = _server()
    follower = Follower(server.port)
    client = follower.coordinator.client

    def unreachable() -> Any:
        raise RuntimeError("timed out connecting")

    client._opener = unreachable
    client._store = None
    assert follower.follow_for(follower.opened.give_up_at - follower.clock() - 1) is None
    assert follower.opened.store_gone is None
    del server
