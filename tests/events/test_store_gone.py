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


def test_this_hosts_peers_are_still_known_once_the_store_is_gone() -> None:
    """The store's host process (rank 0) dies: the lines read before name its pid, so ``/proc``
    still tells that it is gone, after the cache period too (the store cannot be read again)."""
    import subprocess
    import sys

    from lightning_ncclx.events.liveness import ProcessInfo, _stat, this_process
    from lightning_ncclx.events.local_peers import CACHE_SECONDS, LocalPeers
    from support import FakeClock

    me = this_process(1)
    assert me is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stat = _stat(child.pid)
        assert stat is not None
        peer = ProcessInfo(0, me.host, child.pid, stat[1], me.scope)
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
        client = StoreClient(opener=StoreAddress("127.0.0.1", server.port).connect, op_timeout_seconds=0.5)
        clock = FakeClock()
        LocalPeers(client, 0, 4, refuse=lambda error: None, clock=clock).register(peer)
        reader = LocalPeers(client, 1, 4, refuse=lambda error: None, clock=clock)
        reader.register(me)
        assert set(reader.peers()) == {0} and not reader.rank_gone(0)
        del server
        gc.collect()
        child.kill()
        child.wait()
        clock.advance(CACHE_SECONDS + 1)
        assert reader.rank_gone(0)
    finally:
        child.kill()
        child.wait()
