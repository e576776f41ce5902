"""How a rank learns that another rank started a dump event without asking the store every poll.

Each rank keeps one request open on the job's store: a blocking ``wait`` on its own key
``bell/<rank>``, from a thread of its own with a connection of its own. The rank that starts an
event rings every bell at once (one ``multi_set``), and the store answers every open ``wait`` as
the keys appear. In steady state the store therefore serves no request at all (one renewal per
``WAIT_SECONDS`` per rank), instead of one ``check`` per rank per poll interval.

The listener deletes its key as soon as it wakes, so no bell outlives the ring it carried; a
rank's own stop is a ring with a token only this listener knows (a stop left behind by an
earlier watchdog in the process is then just one extra poll for the next one).

Only for a ``TCPStore``: its server answers waits as keys appear. A ``FileStore`` implements
``wait`` by re-reading its file every few milliseconds, and a ``HashStore`` lives in one process,
so those keep the poll (:func:`listening_store` returns None for them).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable

log = logging.getLogger(__name__)

WAIT_SECONDS = 24 * 3600.0
"""How long one ``wait`` stays open before the listener renews it (torch logs a warning line
when a wait times out, so this is long)."""
STOP_JOIN_SECONDS = 2.0


def bell_key(rank: int) -> str:
    return f"bell/{rank}"


def listening_store(job_store: Any) -> Any | None:
    """A second private connection to the job's store for the blocking wait, or None where the
    store below the prefixes is not a ``TCPStore`` (or cannot be cloned)."""
    import torch.distributed as dist

    base = job_store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if not isinstance(base, dist.TCPStore):
        return None
    try:
        return job_store.clone()
    except Exception:  # noqa: BLE001 - older torch: no clone, so no connection to block
        log.debug("store.clone() unavailable: the watchdog polls for events", exc_info=True)
        return None


RING_CHUNK = 512
"""Bells per ``multi_set``. torch's libuv store server applies a request it has only partly
received and applies it again once the rest arrives, so one 16,384-key request (1.7 MB) set about
6,600 bells twice: after their listeners had woken and deleted them (measured with
``bench/bench_store_load.py``). 512 keys (~20 KB) arrive in one read."""


def ring_every_rank(store: Any, world_size: int, event_number: int) -> None:
    """Wake every rank's listener, ``RING_CHUNK`` bells per request (the value is for the logs only)."""
    value = str(event_number)
    for first in range(0, world_size, RING_CHUNK):
        keys = [bell_key(rank) for rank in range(first, min(world_size, first + RING_CHUNK))]
        store.multi_set(keys, [value] * len(keys))


class Doorbell:
    """One rank's listener thread. ``take()`` says whether a ring arrived since the last call;
    ``listening`` turns False for good if the connection fails, and the owner polls instead."""

    def __init__(self, listen_store: Any, stop_store: Any, rank: int, on_ring: Callable[[], None],
                 wait_seconds: float = WAIT_SECONDS) -> None:
        self.rank = rank
        self.rings = 0
        self._listen = listen_store
        self._stop_store = stop_store
        self._on_ring = on_ring
        self._wait = timedelta(seconds=wait_seconds)
        self._key = bell_key(rank)
        self._stop_token = f"stop:{uuid.uuid4().hex}".encode()
        self._rung = threading.Event()
        self._stopping = False
        self._failed = False
        self._thread = threading.Thread(target=self._run, name=f"ncclx-doorbell-rank{rank}", daemon=True)

    @property
    def listening(self) -> bool:
        return self._thread.is_alive() and not self._failed

    def start(self) -> None:
        self._thread.start()

    def take(self) -> bool:
        if not self._rung.is_set():
            return False
        self._rung.clear()
        return True

    def stop(self) -> None:
        self._stopping = True
        if not self._thread.is_alive():
            return
        try:
            self._stop_store.set(self._key, self._stop_token)
        except Exception:  # noqa: BLE001 - the store's host went first: the wait fails on its own
            log.debug("[rank %d] ringing our own bell to stop failed", self.rank, exc_info=True)
        self._thread.join(STOP_JOIN_SECONDS)
        if self._thread.is_alive():
            log.warning("[rank %d] the event listener did not stop within %.0f s; left behind (daemon)",
                        self.rank, STOP_JOIN_SECONDS)

    def _run(self) -> None:
        import torch.distributed as dist

        while True:
            opened = time.monotonic()
            try:
                self._listen.wait([self._key], self._wait)
                value = self._listen.get(self._key)
                self._listen.delete_key(self._key)
            except Exception as error:  # noqa: BLE001 - connection lost: the owner falls back to polling
                ran_out = (isinstance(error, dist.DistStoreError)
                           and time.monotonic() - opened >= self._wait.total_seconds() / 2)
                if ran_out and not self._stopping:
                    continue  # the wait ran its course: renew it
                if not self._stopping:  # also how every job ends for ranks whose store host exits first
                    log.info("[rank %d] the event listener's store connection ended (%s: %s); the watchdog "
                             "polls for events instead, and warns if the store is gone", self.rank,
                             type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "")
                self._failed = True
                self._on_ring()
                return
            if self._stopping or value == self._stop_token:
                return
            self.rings += 1
            self._rung.set()
            self._on_ring()
