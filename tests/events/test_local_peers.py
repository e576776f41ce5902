"""The ranks of this rank's scope, from ``procs/<scope>``: lines without a scope are this scope's,
lines naming another scope are not, and the lines are read once per ``CACHE_SECONDS``."""

from __future__ import annotations

import json

import torch.distributed as dist

from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.liveness import ProcessInfo, this_process
from lightning_ncclx.events.local_peers import CACHE_SECONDS, LocalPeers
from support import FakeClock


class CountedReads(StoreClient):
    """A real in-process store whose non-blocking reads are counted."""

    def __init__(self) -> None:
        super().__init__(dist.PrefixStore("test", dist.HashStore()))
        self.reads = 0

    def read(self, key: str) -> bytes | None:
        self.reads += 1
        return super().read(key)


def _peers(client: StoreClient, rank: int, clock: FakeClock) -> LocalPeers:
    return LocalPeers(client, rank, 8, refuse=lambda error: None, clock=clock)


def test_a_line_leaves_out_the_scope_its_key_names_and_reads_back_in_that_scope() -> None:
    me = this_process(0)
    assert me is not None
    client, clock = CountedReads(), FakeClock()
    for rank in (0, 1):
        _peers(client, rank, clock).register(ProcessInfo(rank, me.host, me.pid, me.start_ticks, me.scope))
    raw = client.read(f"procs/{me.scope}") or b""
    assert all("scope" not in json.loads(line) for line in raw.splitlines())
    reader = _peers(client, 0, clock)
    reader.register(me)
    assert reader.peers() == {1: ProcessInfo(1, me.host, me.pid, me.start_ticks, me.scope)}


def test_a_line_that_names_another_scope_is_not_a_peer() -> None:
    me = this_process(0)
    assert me is not None
    client, clock = CountedReads(), FakeClock()
    client.append(f"procs/{me.scope}", ProcessInfo(3, me.host, me.pid, me.start_ticks, "other-boot/pid:[1]").to_json()
                  + "\n")
    reader = _peers(client, 0, clock)
    reader.register(me)
    assert reader.peers() == {}


def test_the_lines_are_read_once_per_cache_period_and_again_after_it() -> None:
    me = this_process(0)
    assert me is not None
    client, clock = CountedReads(), FakeClock()
    reader = _peers(client, 0, clock)
    reader.register(me)
    _peers(client, 1, clock).register(ProcessInfo(1, me.host, me.pid, me.start_ticks, me.scope))
    before = client.reads
    for _ in range(5):
        assert set(reader.peers()) == {1} and reader.gone_now() == set() and reader.launcher_parent() is None
    assert client.reads == before + 1
    _peers(client, 2, clock).register(ProcessInfo(2, me.host, me.pid, me.start_ticks, me.scope))
    assert set(reader.peers()) == {1}  # registered since the read: seen after the cache period
    clock.advance(CACHE_SECONDS + 1)
    assert set(reader.peers()) == {1, 2} and client.reads == before + 2


def test_a_fresh_read_sees_a_rank_that_registered_within_the_cache_period() -> None:
    """What an event's ``alone`` mark is decided on: a rank that registered a moment ago counts."""
    me = this_process(0)
    assert me is not None
    client, clock = CountedReads(), FakeClock()
    reader = _peers(client, 0, clock)
    reader.register(me)
    assert reader.peers() == {}
    _peers(client, 1, clock).register(ProcessInfo(1, me.host, me.pid, me.start_ticks, me.scope))
    assert reader.peers() == {} and set(reader.peers(fresh=True)) == {1}
