"""Two-phase timeouts: the switch happens once, after the warm-up batches, on a real group."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from lightning_ncclx.backend.timeouts import TimeoutSchedule, apply_timeout_to_all_groups, current_timeouts
from support import free_port


def test_schedule_switches_once_after_warmup() -> None:
    schedule = TimeoutSchedule(timedelta(seconds=100), timedelta(seconds=10), warmup_steps=2)
    decisions = []
    for _ in range(5):
        switch = schedule.should_switch_before_batch()
        decisions.append(switch)
        if switch:
            schedule.switched = True
        schedule.batch_started()
    assert decisions == [False, False, True, False, False]


def test_schedule_with_zero_warmup_switches_before_the_first_batch() -> None:
    schedule = TimeoutSchedule(timedelta(seconds=100), timedelta(seconds=10), warmup_steps=0)
    assert schedule.should_switch_before_batch()


def test_equal_timeouts_need_no_switch() -> None:
    schedule = TimeoutSchedule(timedelta(seconds=10), timedelta(seconds=10), warmup_steps=0)
    assert not schedule.should_switch_before_batch()


def test_apply_sets_every_member_group_on_a_real_gloo_group() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=timedelta(seconds=300))
    dist.new_group([0])
    barriers = []
    refused = apply_timeout_to_all_groups(timedelta(seconds=42), lambda: barriers.append(1))
    assert refused == [] and barriers == [1]
    seen = current_timeouts()
    assert len({name.split("/")[0] for name in seen}) == 2
    assert set(seen.values()) == {42.0}
