"""The store's whole host lost, with the summarizing rank and its host-mates on it: nothing at
that address answers any more, not even with a refusal. The event's meta said the summarizing
rank (0) ran on the store's host with rank 1; the first watcher elsewhere (rank 2) sends the
trigger once the store has answered nothing for the takeover hold past the confirmation, and no
other rank does. A real TCPStore is reached through a TCP relay that the test makes lose its
host: the relayed connections end, and the relay's port, its backlog full, drops every new
connection attempt unanswered (no refusal), as a host that is gone does once the kernel gave up
on the old connection."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from alerts.servers import alert_server
from lightning_ncclx.alerts import AlertNotifier
from lightning_ncclx.alerts.claim import ClaimBoard, watchers
from lightning_ncclx.config import AlertsConfig, WebhookAlertConfig
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from store_relay import LosableRelay, relayed_store
from support import FakeClock

WORLD = 4
NUMBER, EVENT = 1, "stall-001"
INITIATOR, HOST_MATES = 0, (1,)
OPENED = 1_765_000_000.5
"""The event meta's opening time (unix seconds): part of the job-wide dedup key."""


@pytest.fixture
def relay() -> Iterator[LosableRelay]:
    with relayed_store() as relay:
        yield relay


def _watcher(relay: LosableRelay, rank: int, url_env: str, clock: FakeClock) -> AlertNotifier:
    config = AlertsConfig(enabled=True, webhook=WebhookAlertConfig(url_env=url_env), attempt_timeout_seconds=2.0,
                          attempts=1, deadline_seconds=4.0)
    notifier = AlertNotifier(config, rank=rank)
    client = StoreClient(opener=lambda: StoreAddress("127.0.0.1", relay.port).connect(0.5), op_timeout_seconds=0.5,
                         clock=clock, connect_deadline_seconds=2.0)
    notifier.attach_claims(ClaimBoard(client, rank, WORLD, clock=clock))
    return notifier


def _watch(notifier: AlertNotifier, folder: Path, *, on_store_host: bool = False,
           initiator_host: tuple[int, ...] | None = HOST_MATES) -> bool:
    return notifier.watch_claim(folder, number=NUMBER, event=EVENT, reason="stall", initiator=INITIATOR,
                                confirmed_at=0.0, opened=OPENED, initiator_host=initiator_host,
                                on_store_host=on_store_host)


@pytest.mark.parametrize("how", ["lose", "freeze"])
def test_the_first_watcher_off_the_lost_host_sends_the_armed_trigger_and_no_one_else(
        relay: LosableRelay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        how: str) -> None:
    """``lose``: the host's connections end and new ones go unanswered; ``freeze``: they stay open
    and nothing on them is answered (a frozen or powered-off host before the kernel gives up)."""
    assert watchers(INITIATOR, WORLD) == [1, 2, 3]  # rank 1 shares the lost host: rank 2 is the first one off it
    folder = tmp_path / "node-b" / "run-7" / EVENT
    folder.mkdir(parents=True)
    clock = FakeClock(100.0)
    with alert_server(tmp_path / "srv") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        summarizing = AlertNotifier(AlertsConfig(enabled=True), rank=INITIATOR)
        summarizing.attach_claims(ClaimBoard(StoreClient(opener=StoreAddress("127.0.0.1", relay.port).connect),
                                             INITIATOR, WORLD, clock=clock))
        armed_folder = tmp_path / "node-a" / "run-7" / EVENT
        armed_folder.mkdir(parents=True)
        summarizing.arm(armed_folder, number=NUMBER, event=EVENT, reason="stall", exit_code=75,
                        claim_within_seconds=0.0, opened=OPENED)
        first, other = _watcher(relay, 2, "HOOK_URL", clock), _watcher(relay, 3, "HOOK_URL", clock)
        on_the_store_host = _watcher(relay, 2, "HOOK_URL", clock)
        not_on_it = _watcher(relay, 2, "HOOK_URL", clock)
        for notifier in (first, other, on_the_store_host, not_on_it):
            assert not _watch(notifier, folder)  # the claim read: armed, within its hold
        getattr(relay, how)()  # host A, with ranks 0 and 1 and the store, is gone
        hold = first.takeover_hold_seconds
        assert not _watch(first, folder)  # the first read that gets no answer: judged from now on
        clock.advance(hold - 1)
        assert not _watch(first, folder)
        clock.advance(2)
        with caplog.at_level("WARNING"):
            assert _watch(first, folder)
            assert not _watch(other, folder) and not _watch(other, folder)
            assert not _watch(on_the_store_host, folder, on_store_host=True)
            assert not _watch(not_on_it, folder, initiator_host=None)  # the meta did not place rank 0 there
            clock.advance(hold + 1)
            assert not _watch(other, folder) and not _watch(on_the_store_host, folder, on_store_host=True)
            assert not _watch(not_on_it, folder, initiator_host=None)
            assert not _watch(first, folder)  # once is all
            closed = _watcher(relay, 2, "HOOK_URL", clock)
            closed.claims.client.close()  # this rank's own client, closed: no word on the store
            assert not _watch(closed, folder)
            clock.advance(hold + 1)
            assert not _watch(closed, folder)
        first.drain()
        posts = server.posts("/hook")
    assert len(posts) == 1, posts
    body = posts[0]["body"]
    assert body["action"] == "trigger" and body["event"] == EVENT
    assert body["dedup_key"] == f"lightning-ncclx/run-7/stall-001/{round(OPENED * 1000):x}"  # the armed one
    assert "its host is taken to be lost, and with it rank 0, which summarized stall-001 there, and ranks [1]" \
        in caplog.text
    kept = json.loads((folder / "alert-trigger.json").read_text())
    assert {entry["sender"]["rank"] for entry in kept["sinks"].values()} == {2}
    assert {entry["taken_over_from"] for entry in kept["sinks"].values()} == {INITIATOR}


def test_a_store_that_answers_again_restarts_the_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unanswered reads that stop (a slow or briefly cut-off store) are no lost host: the hold
    counts again from the next unanswered read."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    first, second = LosableRelay(server.port), LosableRelay(server.port)
    folder = tmp_path / EVENT
    folder.mkdir()
    clock = FakeClock(100.0)
    monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/never")
    watcher = _watcher(first, 2, "HOOK_URL", clock)
    try:
        assert not _watch(watcher, folder)
        first.lose()
        assert not _watch(watcher, folder)
        assert watcher._unanswered_since
        watcher.claims.client._opener = lambda: StoreAddress("127.0.0.1", second.port).connect(0.5)  # answers again
        clock.advance(6)  # past the client's reconnect gap (5 s), within the takeover hold (9 s)
        assert not _watch(watcher, folder)
        assert not watcher._unanswered_since
    finally:
        first.close()
        second.close()
