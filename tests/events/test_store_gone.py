"""A store client whose server process is gone (the store's host, rank 0, killed): a refused
connection is told at once, instead of the TCPStore client retrying it for its whole connect
timeout on the watchdog thread at every reconnect. A real TCPStore server, really stopped."""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_ncclx.events.connection import StoreAddress, StoreClient, StoreUnavailable, refused


def test_a_store_whose_server_is_gone_is_reported_refused_not_retried_until_the_timeout() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    address = StoreAddress("127.0.0.1", server.port)
    client = StoreClient(opener=address.connect, op_timeout_seconds=0.5)
    client.set("ev/1/meta", "taken")
    assert client.read("ev/1/meta") == b"taken"
    assert not refused(address.host, address.port, 10.0)
    del server
    gc.collect()
    assert refused(address.host, address.port, 10.0)
    with pytest.raises(StoreUnavailable, match="connection refused"):
        client.read("ev/1/meta")
    with pytest.raises(StoreUnavailable, match=r"connection refused"):
        address.connect(connect_timeout_seconds=600.0)  # the TCPStore client alone would retry for 10 minutes
