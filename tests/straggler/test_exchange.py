"""Summaries through a real c10d store: published, counted, read once, deleted."""

from __future__ import annotations

import torch.distributed as dist

from lightning_ncclx.events.connection import StoreClient

from lightning_ncclx.straggler import exchange
from lightning_ncclx.straggler.timings import IntervalSummary


def test_publish_count_collect_and_delete() -> None:
    store = StoreClient(dist.PrefixStore("lightning_ncclx", dist.HashStore()))
    for rank in (0, 2):
        exchange.publish(store, 1, IntervalSummary(rank=rank, interval=4, host="h", batches=5, parts={"forward": 0.1}))
    assert exchange.arrived(store, 1, 4) == 2
    assert exchange.arrived(store, 0, 4) == 0  # another fit's keys are apart
    found = exchange.collect(store, 1, 4, world_size=3)
    assert [s.rank for s in found] == [0, 2]
    assert exchange.arrived(store, 1, 4) == 0 and not store.check(["straggler/1/4/0"])
