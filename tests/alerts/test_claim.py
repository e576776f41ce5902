"""The job-wide alert claim (``ev/<n>/alert``) on a real TCPStore, each rank's board with its own
connection, the clock a counter the test moves: hostile values are refused, never hold back the
summarizing rank nor start a second send; a holder that is gone is taken over by one watcher."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from lightning_ncclx.alerts.claim import LEASE_SECONDS, MAX_CLAIM_BYTES, ClaimBoard, ClaimRecord, watchers
from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.keys import STORE_PREFIX, alert_claim_key

WORLD = 4
EVENT, NUMBER = "stall-001", 1
HOLD = 9.0


def _document(event: str = EVENT, key: str = "lightning-ncclx/run/0a1b2c3d/stall-001") -> dict[str, Any]:
    return {"schema": "lightning-ncclx/alert/1", "action": "trigger", "dedup_key": key, "alert_id": f"{key}/trigger",
            "text": "lightning-ncclx: hang confirmed", "event": event, "culprit_ranks": [1]}


FALLBACK = _document(key="lightning-ncclx/run/ffffffff/stall-001")

HOSTILE: dict[str, bytes] = {
    "not JSON": b"\x00\xff garbage",
    "empty": b"",
    "over the size cap": json.dumps({"rank": 0, "generation": 0, "state": "sending",
                                     "document": dict(_document(), text="x" * (MAX_CLAIM_BYTES + 1))}).encode(),
    "a rank outside the job": ClaimRecord(0, 0, "done").encode().replace(b'"rank":0', b'"rank":99'),
    "a negative generation": ClaimRecord(1, 0, "done").encode().replace(b'"generation":0', b'"generation":-1'),
    "an unknown state": ClaimRecord(1, 0, "done").encode().replace(b'"done"', b'"paused"'),
    "a bool for a rank": ClaimRecord(1, 0, "done").encode().replace(b'"rank":1', b'"rank":true'),
    "another event's document": ClaimRecord(1, 0, "sending", _document(event="stall-002")).encode(),
    "an alert_id with a line break": ClaimRecord(1, 0, "sending", dict(_document(), alert_id="a\r\nb")).encode(),
    "a claim delayed by a day and more": ClaimRecord(1, 0, "armed", _document(), 1e9).encode(),
    "deeply nested JSON": b"[" * 100_000 + b"]" * 100_000,
    "a negative beat": ClaimRecord(1, 0, "sending", _document(), beat=0).encode().replace(b'"beat":0', b'"beat":-1'),
    "a string for a beat": ClaimRecord(1, 0, "sending", _document(), beat=0).encode().replace(b'"beat":0',
                                                                                            b'"beat":"0"'),
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[dist.TCPStore]:
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield store
    del store


def _client(server: dist.TCPStore) -> StoreClient:
    store = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=timedelta(seconds=10))
    return StoreClient(dist.PrefixStore(STORE_PREFIX, store), op_timeout_seconds=5.0)


def _boards(server: dist.TCPStore, clock: Clock, ranks: list[int]) -> list[ClaimBoard]:
    return [ClaimBoard(_client(server), rank, WORLD, clock=clock) for rank in ranks]


def _plant(planter: StoreClient, value: bytes) -> None:
    """``set`` gets no answer: a read on the same connection waits until the server applied it."""
    planter.set(alert_claim_key(NUMBER), value)
    assert planter.read(alert_claim_key(NUMBER)) == value


def _watch(board: ClaimBoard) -> ClaimRecord | None:
    return board.watch(NUMBER, EVENT, confirmed_at=0.0, hold_seconds=HOLD, fallback=lambda: dict(FALLBACK))


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_planted_claim_values_neither_hold_back_nor_double_a_trigger(server: dist.TCPStore, what: str) -> None:
    """A planted value: the summarizing rank overwrites it as it sends; where that rank is gone,
    one watcher of three sends its own document once the value stayed unchanged past the hold;
    once a ``done`` record was read, a value planted over it starts no second send."""
    clock = Clock()
    planter = _client(server)
    initiator, *others = _boards(server, clock, [0, 1, 2, 3])
    _plant(planter, HOSTILE[what])
    held = initiator.hold(NUMBER, _document())
    assert planter.read(alert_claim_key(NUMBER)) == held.encode()  # the summarizing rank sends regardless

    _plant(planter, HOSTILE[what])  # ... and now it is gone
    assert [_watch(board) for board in others] == [None, None, None]  # unchanged for 0 s
    clock.now += HOLD + 0.1
    taken = [_watch(board) for board in others]
    winners = [record for record in taken if record is not None]
    assert len(winners) == 1, taken
    assert winners[0].generation == 1 and winners[0].document == FALLBACK
    assert planter.read(alert_claim_key(NUMBER)) == winners[0].encode()

    winner = others[taken.index(winners[0])]
    winner.finish(NUMBER, winners[0])
    clock.now += 1.0
    assert [_watch(board) for board in others] == [None, None, None]  # every watcher read ``done``
    _plant(planter, HOSTILE[what])
    clock.now += 10 * HOLD
    assert [_watch(board) for board in others] == [None, None, None]
    _plant(planter, ClaimRecord(3, 5, "sending", _document()).encode())  # even a well-formed record
    clock.now += 10 * HOLD
    assert [_watch(board) for board in others] == [None, None, None]


def test_an_armed_claim_without_beats_is_taken_over_with_its_document_only_after_its_own_delay(
        server: dist.TCPStore) -> None:
    clock = Clock()
    planter = _client(server)
    watcher, = _boards(server, clock, [0])
    _plant(planter, ClaimRecord(2, 0, "armed", _document(), 30.0).encode())  # no ``beat``: judged by the hold
    assert _watch(watcher) is None
    clock.now += HOLD + 29.0
    assert _watch(watcher) is None  # the summarizing rank may still be waiting for its confirmation
    clock.now += 1.5
    taken = _watch(watcher)
    assert taken is not None and taken.document == _document() and taken.generation == 1


def _hold_for(board: ClaimBoard, seconds: float) -> None:
    board.hold_seconds = seconds


def test_a_holder_that_beats_is_kept_past_its_hold_and_taken_over_a_lease_after_its_last_beat(
        server: dist.TCPStore) -> None:
    """The summarizing rank arms its claim (it pages once its hang is confirmed, within 30 s)
    and beats it: watchers that judge a silent record by a 60 s hold leave a beating one alone for
    as long as it beats, and take it over ``LEASE_SECONDS`` after its last beat, not 60 s + 30 s."""
    clock = Clock()
    initiator, watcher, other = _boards(server, clock, [2, 0, 1])
    _hold_for(initiator, 60.0)
    hold = 60.0
    initiator.arm(NUMBER, _document(), claim_within_seconds=30.0)

    def watch(board: ClaimBoard) -> ClaimRecord | None:
        return board.watch(NUMBER, EVENT, confirmed_at=0.0, hold_seconds=hold, fallback=lambda: dict(FALLBACK))

    for _ in range(20):  # 20 x 4 s: past the hold and the armed delay
        assert watch(watcher) is None and watch(other) is None
        clock.now += 4.0
        assert initiator.beat()
    held = initiator.hold(NUMBER, _document())  # confirmed: it sends, and beats as it does
    for _ in range(3):
        assert watch(watcher) is None and watch(other) is None
        clock.now += LEASE_SECONDS - 0.5
        assert initiator.beat()
    # SIGKILLed: no beat from here
    assert watch(watcher) is None and watch(other) is None
    clock.now += LEASE_SECONDS - 0.5
    assert watch(watcher) is None and watch(other) is None
    clock.now += 1.0
    taken = [watch(watcher), watch(other)]
    winners = [record for record in taken if record is not None]
    assert len(winners) == 1 and winners[0].document == held.document and winners[0].generation == 1, taken
    assert winners[0].beat == 0


def test_a_holder_stops_beating_a_claim_another_rank_took_and_finishes_only_its_own(server: dist.TCPStore) -> None:
    clock = Clock()
    initiator, watcher = _boards(server, clock, [2, 0])
    held = initiator.hold(NUMBER, _document())
    assert _watch(watcher) is None
    clock.now += LEASE_SECONDS + 0.1  # frozen, not dead: its claim is taken over
    taken = _watch(watcher)
    assert taken is not None
    assert not initiator.beat() and not initiator.holding()  # the record is the watcher's now: left alone
    initiator.finish(NUMBER, held)  # the frozen sender wakes and finishes: the taker's record stands
    assert watcher.client.read(alert_claim_key(NUMBER)) == taken.encode()
    assert watcher.beat()
    watcher.finish(NUMBER, taken)
    assert ClaimRecord.parse(watcher.client.read(alert_claim_key(NUMBER)), WORLD, EVENT).state == "done"
    assert not watcher.holding()


def test_beats_end_with_the_hold_and_on_release(server: dist.TCPStore) -> None:
    """No claim is beaten for ever: an armed record stops at its delay plus the hold, a sending
    one at the hold, a released one (the event recovered) at once."""
    clock = Clock()
    initiator, = _boards(server, clock, [2])
    _hold_for(initiator, HOLD)
    initiator.arm(NUMBER, _document(), claim_within_seconds=5.0)
    clock.now += HOLD + 4.9
    assert initiator.beat()
    clock.now += 0.2
    assert not initiator.beat() and not initiator.holding()
    initiator.hold(NUMBER, _document())
    clock.now += HOLD - 0.1
    assert initiator.beat()
    clock.now += 0.2
    assert not initiator.beat()
    initiator.arm(NUMBER + 1, _document(event="stall-002"), claim_within_seconds=5.0)
    assert initiator.holding()
    initiator.release(NUMBER + 1)
    assert not initiator.holding()


def test_a_live_holder_that_moves_on_is_never_taken_over(server: dist.TCPStore) -> None:
    clock = Clock()
    initiator, watcher = _boards(server, clock, [2, 0])
    initiator.arm(NUMBER, _document(), claim_within_seconds=0.0)
    assert _watch(watcher) is None
    clock.now += HOLD - 1
    held = initiator.hold(NUMBER, _document())
    assert _watch(watcher) is None
    clock.now += HOLD - 1
    initiator.finish(NUMBER, held)
    clock.now += 100 * HOLD
    assert _watch(watcher) is None


def test_a_rank_of_the_senders_host_takes_over_only_from_that_sender(server: dist.TCPStore) -> None:
    clock = Clock()
    sender, remote, local = _boards(server, clock, [2, 0, 3])
    sender.hold(NUMBER, _document())
    clock.now += HOLD + 1
    assert _watch(remote) is None  # first read: unchanged for 0 s on its clock
    clock.now += HOLD + 1
    assert _watch(remote) is not None  # the sender is gone: a rank of another host holds it now
    assert local.take_from(NUMBER, EVENT, 2, _document()) is None
    assert local.take_from(NUMBER, EVENT, 0, _document()) is not None  # that holder died too


def test_watchers_are_every_other_rank_in_a_small_job_and_spread_in_a_large_one() -> None:
    assert watchers(2, 3) == [0, 1]
    spread = watchers(5, 64)
    assert len(spread) == 8 and 5 not in spread
    assert len({rank // 8 for rank in spread}) >= 7  # of 8-rank hosts, at most one holds two


def test_a_holder_past_its_hold_still_finishes_its_own_beaten_record(server: dist.TCPStore) -> None:
    """Beats end with the hold, but the record stays the holder's: a delivery that ends after it
    (a starved thread) still marks its last beaten record ``done``, so no watcher sends again."""
    clock = Clock()
    initiator, watcher = _boards(server, clock, [2, 0])
    _hold_for(initiator, HOLD)
    held = initiator.hold(NUMBER, _document())
    clock.now += 1.0
    assert initiator.beat() and initiator.beat()
    clock.now += HOLD
    assert not initiator.beat() and not initiator.holding()
    initiator.finish(NUMBER, held)
    assert ClaimRecord.parse(watcher.client.read(alert_claim_key(NUMBER)), WORLD, EVENT).state == "done"
    clock.now += 10 * HOLD
    assert _watch(watcher) is None
