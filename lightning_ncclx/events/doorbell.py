"""How a rank learns that something happened in an event without asking the store every poll.

Each rank keeps one request open on the job's store: a blocking ``wait`` on its own key
``bell/<rank>``, from a thread of its own with a connection of its own. Whoever changes an event
rings the bells of the ranks concerned (:func:`ring`): every rank when an event starts or ends,
only the wanted ranks when the initiator asks for full dumps. The store answers every open
``wait`` as the keys appear, so in steady state it serves no request at all (one renewal per
``WAIT_SECONDS`` per rank), and a waiting rank learns of a change at once, without polling.

The listener deletes its key before it wakes its owner, and the owner reads the event's keys
after that: a ring that lands meanwhile sets the key again and wakes the next ``wait``, so none
is lost. A rank's own stop sets a flag, then rings its own bell (with a token for the logs).

Only for a ``TCPStore``: its server answers waits as keys appear. A ``FileStore`` implements
``wait`` by re-reading its file every few milliseconds, and a ``HashStore`` lives in one
process, so those keep the poll (the owner passes no address). The listener opens its
connection from its own thread, with a short connect timeout, and reopens it (with a growing
gap) when it is lost; meanwhile ``listening`` is False and the owner polls.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable, Sequence

from lightning_ncclx.events.connection import RECONNECT_GAP_SECONDS, StoreAddress, StoreClient
from lightning_ncclx.events.keys import bell_key

log = logging.getLogger(__name__)

WAIT_SECONDS = 24 * 3600.0
"""How long one ``wait`` stays open before the listener renews it (torch logs a warning line
when a wait times out, so this is long)."""
STOP_JOIN_SECONDS = 2.0
MAX_RECONNECT_GAP_SECONDS = 60.0

RING_CHUNK = 512
"""Bells per ``multi_set``. torch's libuv store server applies a request it has only partly
received and applies it again once the rest arrives, so one 16,384-key request (1.7 MB) set about
6,600 bells twice: after their listeners had woken and deleted them (measured with
``bench/bench_store_load.py``). 512 keys (~20 KB) arrive in one read."""


def ring(client: StoreClient | Any, ranks: Sequence[int] | range, value: str) -> None:
    """Wake the listeners of ``ranks``, ``RING_CHUNK`` bells per request (the value is for logs)."""
    ranks = list(ranks)
    for first in range(0, len(ranks), RING_CHUNK):
        keys = [bell_key(rank) for rank in ranks[first:first + RING_CHUNK]]
        client.multi_set(keys, [value] * len(keys))


def ring_every_rank(client: StoreClient | Any, world_size: int, event_number: int) -> None:
    ring(client, range(world_size), str(event_number))


class Doorbell:
    """One rank's listener thread. ``take()`` says whether a ring arrived since the last call;
    ``listening`` is False while its connection is down (the owner polls meanwhile)."""

    def __init__(self, opener: Callable[[], Any], stop_client: StoreClient | Any, rank: int,
                 on_ring: Callable[[], None], wait_seconds: float = WAIT_SECONDS) -> None:
        self.rank = rank
        self.rings = 0
        self.connects = 0
        self._open = opener
        self._stop_client = stop_client
        self._on_ring = on_ring
        self._wait = timedelta(seconds=wait_seconds)
        self._key = bell_key(rank)
        self._stop_token = f"stop:{uuid.uuid4().hex}".encode()
        self._rung = threading.Event()
        self._stopping = threading.Event()
        self._connected = False
        self._thread = threading.Thread(target=self._run, name=f"ncclx-doorbell-rank{rank}", daemon=True)

    @classmethod
    def for_store(cls, job_store: Any, stop_client: StoreClient | Any, rank: int,
                  on_ring: Callable[[], None]) -> "Doorbell | None":
        """A doorbell on ``job_store``'s server, or None where it is no TCPStore."""
        address = StoreAddress.of(job_store)
        if address is None:
            return None
        return cls(address.connect, stop_client, rank, on_ring)

    @property
    def listening(self) -> bool:
        return self._thread.is_alive() and self._connected

    def start(self) -> None:
        self._thread.start()

    def take(self) -> bool:
        if not self._rung.is_set():
            return False
        self._rung.clear()
        return True

    def stop(self) -> None:
        self._stopping.set()
        if not self._thread.is_alive():
            return
        try:
            self._stop_client.set(self._key, self._stop_token)
        except Exception:  # noqa: BLE001 - the store's host went first: the wait fails on its own
            log.debug("[rank %d] ringing this rank's own bell to stop failed", self.rank, exc_info=True)
        self._thread.join(STOP_JOIN_SECONDS)
        if self._thread.is_alive():
            log.warning("[rank %d] the event listener did not stop within %.0f s; left behind (daemon)",
                        self.rank, STOP_JOIN_SECONDS)
            return
        try:
            # a listener that saw the flag between two waits returned without taking the stop
            # ring: the key would outlive the run (and wake the next listener of this rank)
            self._stop_client.delete_key(self._key)
        except Exception:  # noqa: BLE001 - the store's host went first: nothing is left to clean
            log.debug("[rank %d] deleting this rank's bell after the stop failed", self.rank, exc_info=True)

    def _run(self) -> None:
        gap = RECONNECT_GAP_SECONDS
        while not self._stopping.is_set():
            try:
                store = self._open()
                self.connects += 1
            except Exception as error:  # noqa: BLE001
                self._connected = False
                log.info("[rank %d] the event listener could not connect to the job's store (%s); retrying in "
                         "%.0f s, polling meanwhile", self.rank, _first_line(error), gap)
                self._on_ring()
                if self._stopping.wait(gap):
                    return
                gap = min(MAX_RECONNECT_GAP_SECONDS, 2 * gap)
                continue
            gap = RECONNECT_GAP_SECONDS
            self._connected = True
            if self._listen(store):
                return
            self._connected = False
            self._on_ring()  # the owner polls until the listener is back
            if self._stopping.wait(gap):
                return

    def _listen(self, store: Any) -> bool:
        """Answer rings on ``store`` until stopped (True) or the connection fails (False)."""
        import torch.distributed as dist

        while True:
            opened = time.monotonic()
            try:
                store.wait([self._key], self._wait)
                store.delete_key(self._key)  # its value is for logs: not read (a request per ring saved)
            except Exception as error:  # noqa: BLE001
                ran_out = (isinstance(error, dist.DistStoreError)
                           and time.monotonic() - opened >= self._wait.total_seconds() / 2)
                if ran_out and not self._stopping.is_set():
                    continue  # the wait ran its course: renew it
                if self._stopping.is_set():
                    return True
                # also how every job ends for ranks whose store host exits first
                log.info("[rank %d] the event listener's store connection ended (%s); the watchdog polls for "
                         "events until it is back", self.rank, _first_line(error))
                return False
            if self._stopping.is_set():  # this rank's own stop: the flag is set before the bell rings
                return True
            self.rings += 1
            self._rung.set()
            self._on_ring()


def _first_line(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"
