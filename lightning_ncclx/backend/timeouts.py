"""Two-phase collective timeouts: long for start-up, shorter once training runs steadily.

The switch happens on all ranks together (a barrier first, as torchtitan's ``set_pg_timeouts``
does), so no rank runs a collective under the short timeout while a peer is still compiling.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Callable

from lightning_ncclx.backend import torch_api

log = logging.getLogger(__name__)


def apply_timeout_to_all_groups(timeout: timedelta, barrier: Callable[[], None]) -> list[str]:
    """Barrier, then set ``timeout`` on every group this rank belongs to. Returns the groups
    whose backends refused the change (logged as warnings), empty when all took it."""
    barrier()
    refused: list[str] = []
    for group in torch_api.member_groups():
        try:
            torch_api.set_group_timeout(timeout, group)
        except Exception as err:  # noqa: BLE001 - a backend that cannot change timeouts keeps its old one
            name = getattr(group, "group_name", "?")
            refused.append(name)
            log.warning("could not shorten the timeout of process group %s: %s", name, err)
    return refused


def current_timeouts() -> dict[str, float]:
    """Seconds of the default timeout of each backend of each member group: "<group>/<device>" -> s."""
    found: dict[str, float] = {}
    for group in torch_api.member_groups():
        for device, backend in torch_api.group_backends(group):
            seconds = torch_api.backend_timeout_seconds(backend)
            if seconds is not None:
                found[f"{group.group_name}/{device.type}"] = seconds
    return found


class TimeoutSchedule:
    """Counts training batches and switches to the training timeout after the warm-up."""

    def __init__(self, init_timeout: timedelta, training_timeout: timedelta, warmup_steps: int) -> None:
        self.init_timeout = init_timeout
        self.training_timeout = training_timeout
        self.warmup_steps = warmup_steps
        self.batches_started = 0
        self.switched = False

    def should_switch_before_batch(self) -> bool:
        """True exactly once: when ``warmup_steps`` batches have run (before batch ``warmup_steps``)."""
        if self.switched or self.training_timeout >= self.init_timeout:
            return False
        return self.batches_started >= self.warmup_steps

    def batch_started(self) -> None:
        self.batches_started += 1
