"""``shared_client``: one plugin connection per job store server in a process. A store without a
server (``HashStore``, a run without a process group) gets a client of its own each time: a new
store must never get an earlier store's client and its events."""

from __future__ import annotations

import gc

import torch.distributed as dist

from lightning_ncclx.events.connection import release_client, shared_client
from support import free_port


def test_a_new_store_never_gets_the_client_of_an_earlier_one() -> None:
    first = dist.HashStore()
    earlier = shared_client(first, op_timeout_seconds=1.0)
    earlier.set("ev/1/meta", "taken")
    del first
    gc.collect()
    for _ in range(200):
        client = shared_client(dist.HashStore(), op_timeout_seconds=1.0)
        assert client is not earlier
        assert client.read("ev/1/meta") is None


def test_two_users_of_one_store_without_a_server_see_each_others_keys() -> None:
    store = dist.HashStore()
    one, two = shared_client(store, 1.0), shared_client(store, 1.0)
    one.set("ev/1/meta", "taken")
    assert two.read("ev/1/meta") == b"taken"


def test_users_of_one_server_share_one_client_until_every_user_released_it() -> None:
    server = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
    one, two = shared_client(server, 1.0), shared_client(server, 1.0)
    try:
        assert one is two
        release_client(one)
        assert shared_client(server, 1.0) is one
        release_client(one)
    finally:
        release_client(one)
    fresh = shared_client(server, 1.0)
    assert fresh is not one
    release_client(fresh)
