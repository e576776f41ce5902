"""The summarizing rank's sign of life (``ev/<n>/pulse``) on a real ``TCPStore``: the initiator's
count, a follower of another host reading it through :class:`EventParticipation` (a real
heartbeat on a clock moved by hand), and a second client writing what anyone who reaches the
port can write."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from hostile_store import PLUGIN_PREFIX, HostileStore
from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.keys import pulse_key
from lightning_ncclx.events.wire import EventMeta
from lightning_ncclx.watchdog.heartbeat import Heartbeat
from lightning_ncclx.watchdog.initiator_pulse import PULSE_STALE_SECONDS, InitiatorPulse, check_gap
from lightning_ncclx.watchdog.participation import EventParticipation, OpenEvent
from support import FakeClock

WORLD = 3
BAR = 5.0
"""The follower's step threshold (train_step_seconds, nothing learned)."""


@pytest.fixture
def server() -> Iterator[Any]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield store


def _coordinator(server: Any, rank: int) -> EventCoordinator:
    # A generous bound: a read that times out on a crowded machine is not the pulse stopping.
    client = StoreClient(opener=StoreAddress("127.0.0.1", server.port).connect, op_timeout_seconds=5.0)
    return EventCoordinator(client, rank, WORLD)


class Follower:
    """Rank 0 following event 1 of initiator rank 2, with ``dump_and_exit``, stuck since the
    event's heartbeat (its process cannot see rank 2's: ``/proc`` tells nothing)."""

    def __init__(self, server: Any) -> None:
        self.clock = FakeClock(100.0)
        config = WatchdogConfig(train_step_seconds=BAR, first_step_seconds=BAR, auto={"enabled": False},
                                on_stall=StallAction.dump_and_exit)
        self.heartbeat = Heartbeat(config, clock=self.clock)
        self.heartbeat.train_batch_start()
        self.coordinator = _coordinator(server, 0)
        self.coordinator.local_process_gone = lambda rank: False  # another host: no /proc to read
        runtime = SimpleNamespace(rank=0, world_size=WORLD, config=config, coordinator=self.coordinator,
                                  heartbeat=self.heartbeat, clock=self.clock)
        self.participation = EventParticipation(runtime)  # type: ignore[arg-type]
        beat = self.heartbeat.last
        self.opened = OpenEvent(EVENT, False, beat.seq, beat.time, True, [])
        self.reads = 0
        read = self.coordinator.pulse

        def counted(event: EventMeta) -> bytes | None:
            self.reads += 1
            return read(event)

        self.coordinator.pulse = counted  # type: ignore[method-assign]

    def gone_after(self, seconds: float, between: Any = lambda: None) -> bool:
        """Move the clock a second at a time, asking as the watchdog's tick does."""
        for _ in range(int(seconds)):
            self.clock.advance(1.0)
            between()
            if self.participation._initiator_gone(self.opened, read_store=False):
                return True
        return False


EVENT = EventMeta.new(1, "stall", 2, time.time())


def test_a_pulse_that_stops_is_judged_gone_after_the_window_and_not_before(server: Any) -> None:
    follower = Follower(server)
    initiator = InitiatorPulse(_coordinator(server, 2), lambda: [EVENT])
    assert not follower.gone_after(BAR - 1, initiator.beat)
    assert follower.reads == 0  # not stuck past its own bar yet: the store is not asked
    assert not follower.gone_after(60, initiator.beat)  # alive: the count moves
    assert 60 / check_gap(WORLD) - 1 <= follower.reads <= 60 / check_gap(WORLD) + 1
    assert not follower.gone_after(PULSE_STALE_SECONDS - check_gap(WORLD))  # the initiator died: not yet
    assert follower.gone_after(3 * check_gap(WORLD))


def test_a_count_never_seen_is_judged_gone_after_the_same_window_from_the_first_read(server: Any) -> None:
    """The initiator died before its first beat (it beats from the moment it takes part, before
    its own dump: see the next test)."""
    follower = Follower(server)
    assert not follower.gone_after(BAR - 1)
    assert follower.reads == 0
    assert not follower.gone_after(PULSE_STALE_SECONDS - check_gap(WORLD))
    assert follower.reads > 0
    assert follower.gone_after(3 * check_gap(WORLD))


def test_the_initiator_beats_before_it_writes_its_own_dump_and_not_for_an_event_it_never_opened(
        server: Any, tmp_path: Path) -> None:
    config = WatchdogConfig(train_step_seconds=BAR, first_step_seconds=BAR, auto={"enabled": False},
                            on_stall=StallAction.dump_and_exit)
    coordinator = _coordinator(server, 2)
    runtime = SimpleNamespace(rank=2, world_size=WORLD, config=config, coordinator=coordinator,
                              heartbeat=Heartbeat(config), clock=time.monotonic, dump_dir=tmp_path,
                              native_stacks_disarm=lambda: None)
    participation = EventParticipation(runtime)  # type: ignore[arg-type]
    reader = _coordinator(server, 0)
    seen_while_dumping: list[bytes | None] = []

    def write_dump(*_: Any) -> list[Path]:
        deadline = time.monotonic() + 30  # the thread's first beat comes as it starts
        while reader.pulse(EVENT) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        seen_while_dumping.append(reader.pulse(EVENT))
        raise OSError("the dump could not be written")

    participation._write_dump = write_dump  # type: ignore[method-assign]
    participation._count = lambda *_: True  # type: ignore[method-assign]
    try:
        with pytest.raises(OSError):
            participation.take_part(EVENT, detected=True)
        assert seen_while_dumping and seen_while_dumping[0] is not None
        assert participation._decided_here() == []  # never opened: no more beats for it
    finally:
        participation.stop_pulse()


def test_a_rank_that_moves_never_reads_the_pulse_nor_leaves_by_it(server: Any, tmp_path: Path) -> None:
    """What a store client writing the key cannot do: make a rank that is making progress take
    the summarizing rank for gone (it never even reads the key)."""
    follower = Follower(server)
    with HostileStore("127.0.0.1", server.port, prefix=PLUGIN_PREFIX, timeout_seconds=30) as hostile:
        hostile.set(pulse_key(1), "7")
        for _ in range(5):
            assert not follower.gone_after(20, follower.heartbeat.train_batch_start)  # steps go on
    assert follower.reads == 0


def test_a_store_client_that_keeps_changing_the_key_only_delays_the_judgement(server: Any) -> None:
    """What it can do: hold a judgement back by changing the value (a deletion counts as a
    change); once it stops, the window runs as for a silent initiator."""
    follower = Follower(server)
    InitiatorPulse(_coordinator(server, 2), lambda: [EVENT]).beat()  # one beat, then the initiator died
    with HostileStore("127.0.0.1", server.port, prefix=PLUGIN_PREFIX, timeout_seconds=30) as hostile:
        written = iter(range(1_000_000))

        def rewrite() -> None:
            n = next(written)
            if n % 3 == 2:
                hostile.delete(pulse_key(1))
            else:
                hostile.set(pulse_key(1), f"planted {n}")

        assert not follower.gone_after(120, rewrite)
    assert follower.gone_after(PULSE_STALE_SECONDS + 2 * check_gap(WORLD))


def test_the_pulse_thread_writes_a_rising_count_until_stopped(server: Any) -> None:
    reader = _coordinator(server, 0)
    events: list[EventMeta] = [EVENT]
    pulse = InitiatorPulse(_coordinator(server, 2), lambda: list(events), interval_seconds=0.05)
    pulse.ensure_started()
    try:
        seen: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 3 and time.monotonic() < deadline:
            raw = reader.pulse(EVENT)
            if raw is not None:
                seen.add(raw)
            time.sleep(0.05)
        assert len(seen) >= 3 and all(raw.isdigit() for raw in seen), seen
    finally:
        pulse.stop()
    assert pulse._thread is not None and not pulse._thread.is_alive()


def test_the_pulse_key_goes_with_the_events_other_keys(server: Any) -> None:
    coordinator = _coordinator(server, 0)
    coordinator.set_pulse(EVENT, 3)
    assert coordinator.pulse(EVENT) == b"3"
    coordinator.forget(EVENT)
    assert coordinator.pulse(EVENT) is None
