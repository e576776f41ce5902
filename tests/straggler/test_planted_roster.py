"""The straggler exchange's count of ranks that published an interval, on a real ``TCPStore``
another client wrote into first: ranks append to a roster (never ``add``, which fails on a
planted value and makes the server drop the connection the watchdog, the consensus and straggler
detection share), and the reader counts only lines that name ranks of the job."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from hostile_store import PLUGIN_PREFIX, HostileStore
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.straggler import exchange
from lightning_ncclx.straggler.timings import IntervalSummary


@pytest.fixture
def server() -> Iterator[Any]:
    yield dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def test_a_planted_counter_costs_no_connection_and_is_not_counted(server: Any) -> None:
    address = StoreAddress("127.0.0.1", server.port)
    client = StoreClient(opener=address.connect, op_timeout_seconds=2.0)  # as a rank's: keys under the plugin's prefix
    with HostileStore("127.0.0.1", server.port, prefix=PLUGIN_PREFIX, timeout_seconds=30) as hostile:
        hostile.set("straggler/1/4/n", "not a count\n7\n")
    for rank in (0, 1):
        exchange.publish(client, 1, IntervalSummary(rank=rank, interval=4, host="h", batches=5,
                                                    parts={"forward": 0.1}))
    assert client.reconnects == 0
    assert exchange.arrived(client, 1, 4, world_size=2) == 2
    assert [s.rank for s in exchange.collect(client, 1, 4, world_size=2)] == [0, 1]
