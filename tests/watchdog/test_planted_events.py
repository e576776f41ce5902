"""Events another store client plants, seen by one rank's watchdog (world size 1, in-memory
store, injected clock): they cost a dump, never this rank's own detection; an event that neither
recovers nor is confirmed stops being followed; the store is never asked from the main thread at
setup."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.events.keys import meta_key
from lightning_ncclx.events.wire import EventMeta
from lightning_ncclx.watchdog.runtime import WatchdogRuntime
from support import FakeClock


def _runtime(tmp_path: Path, **overrides) -> tuple[WatchdogRuntime, FakeClock]:
    values = dict(train_step_seconds=5.0, first_step_seconds=5.0, collect_timeout_seconds=1.0,
                  auto={"enabled": False}, on_stall=StallAction.dump, max_dumps_per_run=3)
    values.update(overrides)
    clock = FakeClock(50.0)
    return WatchdogRuntime(WatchdogConfig(**values), tmp_path / "dumps", clock=clock, exit_fn=lambda code: None), clock


def _plant_stall(runtime: WatchdogRuntime, number: int) -> None:
    runtime.client.set(meta_key(number), EventMeta.new(number, "stall", 0, time.time()).to_json())


def test_planted_stall_events_spend_no_dump_of_this_rank_and_expire(tmp_path: Path) -> None:
    """Before, three planted stall events reached max_dumps_per_run (3) and a real stall after
    them was never dumped; an unrecovered event stayed followed for the rest of the run."""
    runtime, clock = _runtime(tmp_path)
    runtime.heartbeat.train_batch_start()
    runtime._tick()
    for number in (1, 2, 3):
        _plant_stall(runtime, number)
        runtime._tick()  # joined: this rank dumps for it
        runtime.heartbeat.train_batch_start()  # training goes on
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["stall-001", "stall-002", "stall-003"]
    assert runtime.stall_events == 0
    clock.now += 6.0  # now a real stall of this rank
    runtime._tick()
    assert (tmp_path / "dumps" / "stall-004").is_dir()
    assert runtime.stall_events == 1
    assert sorted(runtime.participation.open) == [4]  # the planted ones ended (this rank moved on)
    clock.now += 3600.0  # far past its window, neither recovered nor confirmed (on_stall: dump)
    runtime._tick()
    assert runtime.participation.open == {}  # no longer followed


def test_setup_asks_the_store_nothing_on_the_main_thread(tmp_path: Path) -> None:
    runtime, _ = _runtime(tmp_path, poll_interval_seconds=5.0)
    asked_from: list[str] = []
    stepped = threading.Event()
    skip = runtime.coordinator.skip_past_events

    def recorded() -> int:
        asked_from.append(threading.current_thread().name)
        stepped.set()
        return skip()

    runtime.coordinator.skip_past_events = recorded  # type: ignore[method-assign]
    try:
        runtime.start()
        assert asked_from == [] or asked_from == [runtime._thread.name]
        assert stepped.wait(60), "the watchdog thread never registered with the store"
    finally:
        runtime.stop()
    assert asked_from == [runtime._thread.name]
