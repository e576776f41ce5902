"""A store whose host freezes (or powers off): the connections stay open and nothing is answered,
not even a refusal. torch's TCPStore client waits for such an answer whatever its timeout, in a
request and in a new connection's handshake, until the kernel gives up (~15 minutes). The
plugin's client waits at most its deadline, gives the connection up, and opens a new one once the
store answers again. A real TCPStore behind a relay (``tests/store_relay.py``) that the test
freezes."""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from lightning_ncclx.events.connection import (
    MAX_UNANSWERED_LANES, StoreAddress, StoreClient, StoreUnanswered, StoreUnavailable,
)
from store_relay import LosableRelay, relayed_store
from support import FakeClock

GUARD_SECONDS = 60.0
"""A call still running after this long is taken as blocked for good (torch's own behaviour)."""


@pytest.fixture
def relay() -> Iterator[LosableRelay]:
    with relayed_store() as relay:
        yield relay


def _client(relay: LosableRelay, clock: FakeClock) -> StoreClient:
    return StoreClient(opener=lambda: StoreAddress("127.0.0.1", relay.port).connect(1.0), op_timeout_seconds=0.5,
                       clock=clock, connect_deadline_seconds=2.0)


def _outcome(call: Callable[[], Any]) -> BaseException | Any:
    """``call``'s value or error, from a thread of its own so a call blocked for good fails the
    test instead of hanging it."""
    return _outcome_later(call)()


def _store_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ncclx-store"]


def test_a_request_to_a_frozen_store_fails_within_the_deadline_and_a_thawed_store_is_read_again(
        relay: LosableRelay) -> None:
    clock = FakeClock(1000.0)
    client = _client(relay, clock)
    client.set("key", b"value")
    assert client.read("key") == b"value"
    relay.freeze()

    error = _outcome(lambda: client.read("key"))
    assert isinstance(error, StoreUnanswered), error
    assert "answered nothing" in str(error)
    # the next request opens a new connection, whose handshake the frozen store leaves unanswered too
    error = _outcome(lambda: client.read("key"))
    assert isinstance(error, StoreUnavailable) and "StoreUnanswered" in str(error), error

    relay.thaw()  # the kernel gives up on the frozen connections: the threads waiting on them end
    clock.advance(120.0)  # past the reconnect back-off
    assert _outcome(lambda: client.read("key")) == b"value"
    client.close()


def test_a_store_frozen_for_good_leaves_at_most_the_cap_of_waiting_threads(relay: LosableRelay) -> None:
    clock = FakeClock(1000.0)
    client = _client(relay, clock)
    assert client.read("absent") is None
    before = len(_store_threads())
    relay.freeze()
    errors = []
    for _ in range(MAX_UNANSWERED_LANES + 3):
        errors.append(_outcome(lambda: client.read("absent")))
        clock.advance(120.0)
    assert all(isinstance(e, StoreUnavailable) for e in errors), errors
    assert "still waiting for an answer" in str(errors[-1])
    assert len(_store_threads()) - before <= MAX_UNANSWERED_LANES
    client.close()
    relay.thaw()


def test_requests_of_several_threads_during_a_freeze_all_return(relay: LosableRelay) -> None:
    """The watchdog, consensus and straggler threads share one connection: none is left waiting."""
    client = _client(relay, FakeClock(1000.0))
    assert client.read("absent") is None
    relay.freeze()
    outcomes = [_outcome_later(lambda: client.read("absent")) for _ in range(3)]
    results = [wait() for wait in outcomes]
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    client.close()
    relay.thaw()


def _outcome_later(call: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``call`` on a thread; the returned function waits (``GUARD_SECONDS`` at most) for
    its value or error."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as error:  # noqa: BLE001
            box.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()

    def wait() -> Any:
        worker.join(GUARD_SECONDS)
        assert not worker.is_alive(), f"a call was still waiting after {GUARD_SECONDS:.0f} s"
        return box[0]
    return wait


@pytest.mark.parametrize("how", ["closed", "dropped"])
def test_a_client_closed_or_dropped_ends_its_connection_thread(relay: LosableRelay, how: str) -> None:
    before = set(_store_threads())
    client = _client(relay, FakeClock(1000.0))
    assert client.read("absent") is None
    (thread,) = set(_store_threads()) - before
    if how == "closed":
        client.close()
    else:
        del client
        gc.collect()
    thread.join(GUARD_SECONDS)
    assert not thread.is_alive()


class _SlowStore:
    """A real store whose every request first sleeps (the GIL released), so it is in flight when
    the test's other thread takes the GIL."""

    def __init__(self, store: Any, seconds: float) -> None:
        self._store, self._seconds = store, seconds

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def slow(*args: Any) -> Any:
            time.sleep(self._seconds)
            return method(*args)
        return slow


def test_a_request_answered_while_the_process_was_starved_of_the_gil_is_not_given_up(relay: LosableRelay) -> None:
    """The main thread of a rank holds the GIL past the request's deadline (native code that never
    releases it): the store answered in time, but neither the waiting caller nor the connection's
    thread could run. The caller wakes late, so it grants another deadline instead of giving the
    connection up."""
    address = StoreAddress("127.0.0.1", relay.port)
    client = StoreClient(opener=lambda: _SlowStore(address.connect(1.0), 0.3), op_timeout_seconds=0.5)
    client.set("key", b"value")
    client.deadline_seconds = 1.0
    hold_gil = ctypes.PyDLL(None).usleep  # a PyDLL call keeps the GIL for its whole length
    holder = threading.Thread(target=lambda: (time.sleep(0.1), hold_gil(3_000_000)), daemon=True)
    holder.start()
    assert _outcome(lambda: client.read("key")) == b"value"
    holder.join()
    client.close()
