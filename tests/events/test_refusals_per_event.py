"""What the summarizing rank refused is listed per event: a value planted during one event
(on a real ``TCPStore``) is not listed again in the summaries of later events."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from hostile_store import PLUGIN_PREFIX, HostileStore
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.gather import gather_and_summarize
from lightning_ncclx.events.keys import rank_key
from lightning_ncclx.events.wire import Announcement


@pytest.fixture
def server() -> Iterator[Any]:
    yield dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def _event(initiator: EventCoordinator, dump_dir: Path) -> dict:
    event = initiator.propose("on_demand")
    folder = dump_dir / event.name
    folder.mkdir(parents=True)
    (folder / "rank_00000.context.json").write_text(json.dumps({"rank": 0}))
    initiator.announce(event, Announcement(0, "node-0", ("rank_00000.context.json",), str(folder)))
    result = gather_and_summarize(initiator, event, folder, dump_dir=dump_dir, collect_timeout_seconds=1.0,
                                  gather_through_store=True)
    if result.reports_writer is not None:
        assert result.reports_writer.join(60.0)
    return json.loads((folder / "collection.json").read_text())


def test_a_value_refused_in_one_event_is_not_listed_in_the_next(server: Any, tmp_path: Path) -> None:
    client = StoreClient(opener=StoreAddress("127.0.0.1", server.port).connect, op_timeout_seconds=0.5)
    initiator = EventCoordinator(client, 0, 2)
    with HostileStore("127.0.0.1", server.port, prefix=PLUGIN_PREFIX, timeout_seconds=30) as hostile:
        hostile.set(rank_key(1, 1), "PLANTED HEADLINE")
        first = _event(initiator, tmp_path)
    assert any("rank 1" in line for line in first["refused"]), first
    second = _event(initiator, tmp_path)
    assert not any("rank 1" in line for line in second["refused"]), second
