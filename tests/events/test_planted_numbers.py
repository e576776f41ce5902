"""Event numbers taken by planted values, on a real ``TCPStore``: however many a store client
planted, a rank finds a free number (and the others find its event) in a number of store requests
that does not grow with the run, at setup as when it proposes."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.coordinator import MAX_SKIPPED_PER_CALL, TRIES_AFTER_JUMP, EventCoordinator
from lightning_ncclx.events.keys import meta_key
from lightning_ncclx.events.wire import EventMeta
from support import free_port

READS_BOUND = MAX_SKIPPED_PER_CALL + TRIES_AFTER_JUMP + 2 * 41
"""One call's requests at most: the numbers tried one by one, and doubling then halving."""


class CountingStore:
    """The real store, each request counted."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.requests = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.requests += 1
            return method(*args, **kwargs)
        return counted


@pytest.fixture()
def server():
    store = dist.TCPStore("127.0.0.1", free_port(), is_master=True, timeout=timedelta(seconds=30))
    yield store
    del store


def _client(server: Any) -> tuple[StoreClient, CountingStore]:
    counting = CountingStore(dist.PrefixStore("lightning_ncclx", server))
    return StoreClient(counting), counting


def _plant_closed(server: Any, first: int, last: int) -> None:
    planter = dist.PrefixStore("lightning_ncclx", server)
    numbers = list(range(first, last + 1))
    for start in range(0, len(numbers), 10_000):
        batch = numbers[start:start + 10_000]
        planter.multi_set([meta_key(n) for n in batch],
                          [EventMeta.new(n, "stall", 0, time.time()).to_json(closed=True) for n in batch])


def test_200_planted_closed_events_do_not_stop_a_proposal(server: Any) -> None:
    """Before, one call stepped past 64 numbers and gave up ("no event number free within 64"),
    and the stall was marked reported: the real hang was never dumped."""
    _plant_closed(server, 1, 200)
    client, counting = _client(server)
    proposer = EventCoordinator(client, 1, 2)
    event = proposer.propose("stall")
    assert event is not None and event.number == 201 and event.initiator == 1
    assert counting.requests <= READS_BOUND
    other_client, other_counting = _client(server)
    other = EventCoordinator(other_client, 0, 2)
    assert other.poll() == event  # the other rank finds it past the planted run
    assert other_counting.requests <= READS_BOUND


def test_setup_steps_past_100000_planted_events_in_a_bounded_number_of_requests(server: Any) -> None:
    _plant_closed(server, 1, 100_000)
    client, counting = _client(server)
    later = EventCoordinator(client, 0, 2)
    assert later.skip_past_events() == 100_000
    assert counting.requests <= READS_BOUND  # before: one read per planted number
    assert later.propose("stall").number == 100_001


def test_an_open_event_after_the_planted_run_is_joined(server: Any) -> None:
    _plant_closed(server, 1, 300)
    first_client, _ = _client(server)
    first = EventCoordinator(first_client, 1, 2)
    event = first.propose("stall")
    assert event is not None and event.number == 301
    client, _ = _client(server)
    joiner = EventCoordinator(client, 0, 2)
    assert joiner.propose("stall") == event  # a concurrent noticer agrees on it
