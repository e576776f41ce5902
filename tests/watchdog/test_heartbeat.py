"""Threshold logic of the heartbeat on an injected clock (no threads, no torch)."""

from __future__ import annotations

import math

import pytest

from lightning_ncclx.config import AutoThresholdConfig, WatchdogConfig
from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase
from support import FakeClock




def make(auto: bool = False, **overrides) -> tuple[Heartbeat, FakeClock]:
    values = dict(first_step_seconds=100.0, train_step_seconds=10.0, validation_seconds=50.0, checkpoint_seconds=70.0,
                  auto=AutoThresholdConfig(enabled=auto, multiplier=3.0, floor_seconds=2.0, warmup_steps=3, window=4))
    values.update(overrides)
    clock = FakeClock(1000.0)
    return Heartbeat(WatchdogConfig(**values), clock=clock), clock


def run_steps(hb: Heartbeat, clock: FakeClock, n: int, seconds: float) -> None:
    for _ in range(n):
        hb.train_batch_start()
        clock.advance(seconds)
        hb.train_batch_end()


def test_setup_and_first_step_use_the_first_step_threshold() -> None:
    hb, clock = make()
    clock.advance(99.0)
    assert hb.check() is None
    hb.train_batch_start()
    assert hb.last.phase is Phase.first_step
    clock.advance(99.0)
    assert hb.check() is None
    clock.advance(2.0)
    stall = hb.check()
    assert stall is not None and stall.phase is Phase.first_step and stall.threshold_seconds == 100.0


def test_training_step_past_its_threshold_is_a_stall() -> None:
    hb, clock = make()
    run_steps(hb, clock, 2, 1.0)
    hb.train_batch_start()
    clock.advance(9.9)
    assert hb.check() is None
    clock.advance(0.2)
    stall = hb.check()
    assert stall is not None and stall.phase is Phase.train_step and stall.step == 2


def test_gap_between_batches_counts_as_a_training_step() -> None:
    hb, clock = make()
    run_steps(hb, clock, 2, 1.0)
    clock.advance(10.5)  # stuck in the data loader after batch_end
    assert hb.check() is not None


def test_one_alarm_per_heartbeat() -> None:
    hb, clock = make()
    run_steps(hb, clock, 2, 1.0)
    clock.advance(11.0)
    stall = hb.check()
    assert stall is not None
    hb.mark_reported(stall.seq)
    clock.advance(100.0)
    assert hb.check() is None
    hb.train_batch_start()
    clock.advance(11.0)
    assert hb.check() is not None


@pytest.mark.parametrize(("phase", "threshold"), [(Phase.validation, 50.0), (Phase.checkpoint, 70.0)])
def test_validation_and_checkpoint_have_their_own_thresholds(phase: Phase, threshold: float) -> None:
    hb, clock = make()
    run_steps(hb, clock, 2, 1.0)
    hb.beat(phase)
    clock.advance(threshold - 1.0)
    assert hb.check() is None
    clock.advance(2.0)
    assert hb.check().phase is phase


def test_idle_never_alarms() -> None:
    hb, clock = make()
    run_steps(hb, clock, 2, 1.0)
    hb.beat(Phase.idle)
    clock.advance(1e7)
    assert hb.check() is None
    assert hb.progress()["stall_threshold_seconds"] is None
    assert math.isinf(hb.threshold(Phase.idle))


def test_sanity_check_validation_gets_the_start_up_threshold() -> None:
    hb, clock = make()
    hb.sanity_check(True)
    clock.advance(90.0)  # longer than validation_seconds: nothing has warmed up yet
    assert hb.check() is None
    hb.sanity_check(False)
    assert hb.last.phase is Phase.setup


def test_auto_threshold_is_learned_after_warm_up() -> None:
    hb, clock = make(auto=True)
    run_steps(hb, clock, 3, 1.0)  # first batch not counted: 2 observed
    assert hb.auto_threshold() is None
    run_steps(hb, clock, 1, 1.0)
    assert hb.auto_threshold() == pytest.approx(3.0)  # 3 x slowest recent step
    hb.train_batch_start()
    clock.advance(3.5)
    assert hb.check() is not None


def test_auto_threshold_respects_floor_window_and_upper_bound() -> None:
    hb, clock = make(auto=True)
    run_steps(hb, clock, 5, 0.1)
    assert hb.auto_threshold() == pytest.approx(2.0)  # floor
    run_steps(hb, clock, 1, 5.0)
    assert hb.auto_threshold() == pytest.approx(10.0)  # capped by train_step_seconds
    run_steps(hb, clock, 4, 0.1)  # the slow step leaves the window of 4
    assert hb.auto_threshold() == pytest.approx(2.0)


def test_step_time_excludes_validation_and_checkpoint() -> None:
    hb, clock = make(auto=True)
    run_steps(hb, clock, 4, 1.0)
    hb.beat(Phase.validation)
    clock.advance(40.0)
    run_steps(hb, clock, 1, 1.0)
    assert hb.auto_threshold() == pytest.approx(3.0)


def test_steps_are_counted_in_batches_not_optimizer_steps() -> None:
    hb, clock = make()
    for _ in range(4):
        hb.train_batch_start(global_step=0)  # gradient accumulation: global_step does not move
        clock.advance(1.0)
        hb.train_batch_end(global_step=0)
    assert hb.batches == 4 and hb.progress()["step"] == 4 and hb.progress()["global_step"] == 0


def test_a_later_epochs_start_waits_with_the_validation_threshold_not_the_learned_step_one():
    clock = FakeClock(1000.0)
    cfg = WatchdogConfig(train_step_seconds=100.0, validation_seconds=50.0,
                         auto=AutoThresholdConfig(multiplier=2.0, floor_seconds=1.0, warmup_steps=1))
    hb = Heartbeat(cfg, clock=clock)
    for _ in range(3):
        hb.train_batch_start()
        clock.advance(1.0)
        hb.train_batch_end()
    assert hb.threshold(Phase.train_step) == 2.0
    hb.beat(Phase.epoch_start)
    clock.advance(20.0)  # the loader's workers restart
    assert hb.check() is None
    clock.advance(31.0)
    stall = hb.check()
    assert stall is not None and stall.phase is Phase.epoch_start and stall.threshold_seconds == 50.0


def test_teardown_has_its_own_threshold() -> None:
    clock = [0.0]
    hb = Heartbeat(WatchdogConfig(teardown_seconds=42.0, auto={"enabled": False}), clock=lambda: clock[0])
    hb.train_batch_start()
    hb.train_batch_end()
    hb.beat(Phase.teardown)
    assert hb.threshold(Phase.teardown) == 42.0
    clock[0] += 41.0
    assert hb.check() is None
    clock[0] += 2.0
    stall = hb.check()
    assert stall is not None and stall.phase is Phase.teardown


@pytest.mark.parametrize("forget_before_the_step_ends", [True, False])
def test_a_recovered_stalls_step_is_no_step_time(forget_before_the_step_ends: bool) -> None:
    """One 12 s wait that an event reported and that recovered must not raise the learned step
    threshold, the consensus wait and the overrun bar for the rest of the run."""
    hb, clock = make(auto=True, train_step_seconds=300.0, consensus={"warmup_steps": 3})
    run_steps(hb, clock, 6, 1.0)
    assert hb.consensus_wait() == pytest.approx(3.0) and hb.overrun_bar() == pytest.approx(3.0)
    hb.train_batch_start()
    stalled = hb.last.seq  # the heartbeat the event was about
    clock.now += 12.0
    if forget_before_the_step_ends:
        hb.forget_stall(stalled)
        hb.train_batch_end()
    else:
        hb.train_batch_end()
        hb.forget_stall(stalled)
        run_steps(hb, clock, 1, 1.0)  # the main thread applies it at its next step end
    assert hb.consensus_wait() == pytest.approx(3.0)
    assert hb.auto_threshold() == pytest.approx(3.0)
    assert hb.overrun_bar() == pytest.approx(3.0)


def test_without_a_recovery_a_long_step_counts() -> None:
    hb, clock = make(auto=True, train_step_seconds=300.0, consensus={"warmup_steps": 3})
    run_steps(hb, clock, 6, 1.0)
    run_steps(hb, clock, 1, 12.0)
    assert hb.consensus_wait() == pytest.approx(36.0) and hb.auto_threshold() == pytest.approx(36.0)
