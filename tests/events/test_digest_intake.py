"""``DigestIntake``: the two-phase gather expands each digest as its announcement arrives, while
the summarizing rank still waits for the others (real TCPStore, real digests of real files); an
announcement read during the wait is not read again, and one that was not there yet (a roster
line planted before it) is read after the wait."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from hostile_store import HostileStore
from lightning_ncclx.dump.digest import make_digest
from lightning_ncclx.events.collection import CollectionResult
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.keys import rank_key, roster_key
from lightning_ncclx.events.two_phase import DigestIntake, finish_digest_files
from lightning_ncclx.events.wire import Announcement, EventMeta

PLUGIN_PREFIX = "lightning_ncclx"
WORLD = 3


@pytest.fixture
def server() -> Iterator[Any]:
    yield dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def coordinator(server: Any, rank: int) -> EventCoordinator:
    client = StoreClient(opener=StoreAddress("127.0.0.1", server.port).connect, op_timeout_seconds=0.5)
    return EventCoordinator(client, rank, WORLD)


class CountingReads:
    """The initiator's client, counting the announcement keys it reads."""

    def __init__(self, client: StoreClient) -> None:
        self.client, self.keys_read = client, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def read(self, key: str) -> bytes | None:
        self.keys_read.append(key)
        return self.client.read(key)

    def read_many(self, keys: list[str]) -> list[bytes | None]:
        self.keys_read.extend(keys)
        return self.client.read_many(keys)


def announce_digest(rank: EventCoordinator, event: EventMeta, dumps: Path) -> None:
    folder = dumps / f"node-{rank.rank}"
    folder.mkdir(parents=True)
    context = folder / f"rank_{rank.rank:05d}.context.json"
    context.write_text(json.dumps({"rank": rank.rank, "world_size": WORLD, "host": f"node-{rank.rank}",
                                   "phase": "train_step", "step": 7}))
    rank.announce(event, Announcement(rank.rank, f"node-{rank.rank}", (context.name,), str(folder),
                                      make_digest([context])))


def test_digests_are_expanded_as_they_arrive_and_not_read_twice(server: Any, tmp_path: Path) -> None:
    initiator = coordinator(server, 0)
    counting = CountingReads(initiator.client)
    initiator.client = counting  # type: ignore[assignment]
    event = initiator.propose("stall")
    folder = tmp_path / "dumps" / event.name
    folder.mkdir(parents=True)
    result = CollectionResult(event, folder, WORLD, [0], [1, 2])
    intake = DigestIntake(initiator, result)
    try:
        announce_digest(coordinator(server, 1), event, tmp_path / "hosts")
        read = intake.on_listed(initiator.roster(event, "dumped"))
        assert sorted(read) == [1] and intake.expanded == [1]  # rank 2 has not announced yet
        assert intake.on_listed(initiator.roster(event, "dumped")) == {}  # nothing new: nothing read
        announce_digest(coordinator(server, 2), event, tmp_path / "hosts")
        result.announced = initiator.announced(event, known=read)
        assert sorted(intake.expand_rest()) == [1, 2]
        assert counting.keys_read.count(rank_key(event.number, 1)) == 1, counting.keys_read
        assert counting.keys_read.count(rank_key(event.number, 2)) == 1, counting.keys_read
    finally:
        finish_digest_files(result)
    for rank in (1, 2):
        assert (folder / "ranks" / f"node-{rank}" / f"rank_{rank:05d}.context.json").is_file()
    assert intake.first is not None and {rank for rank, _ in intake.first.memory.contexts.values()} == {1, 2}


def test_a_planted_roster_line_ahead_of_the_announcement_is_read_again_after_the_wait(server: Any,
                                                                                      tmp_path: Path) -> None:
    initiator = coordinator(server, 0)
    event = initiator.propose("stall")
    folder = tmp_path / "dumps" / event.name
    folder.mkdir(parents=True)
    result = CollectionResult(event, folder, WORLD, [0], [1, 2])
    intake = DigestIntake(initiator, result)
    with HostileStore("127.0.0.1", server.port, prefix=PLUGIN_PREFIX, timeout_seconds=30) as hostile:
        hostile.append(roster_key(event.number), "2\n")
        try:
            read = intake.on_listed(initiator.roster(event, "dumped"))
            assert read == {} and intake.expanded == []
            announce_digest(coordinator(server, 2), event, tmp_path / "hosts")
            result.announced = initiator.announced(event, known=read)
            assert 2 in result.announced and intake.expand_rest() == [2]
        finally:
            finish_digest_files(result)
