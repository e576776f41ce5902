"""The other ranks of this rank's scope (same boot and pid namespace: the ranks whose ``/proc``
this process can see), read from ``procs/<scope>``, and which of them are gone.

Every watchdog appends one line for its process once (:meth:`LocalPeers.register`); the line
leaves out the scope, which the key already names (a line that names another scope is not this
scope's). The lines are read once and kept for ``CACHE_SECONDS``: an event reads them once per
rank, not once per step (16,384 ranks x 8 lines each were 19 MiB per event), and a process that
registers later is seen within that time. Every line is checked (:class:`ProcessInfo.from_json`).

Example::

    peers = LocalPeers(client, rank=3, world_size=8, refuse=log.warning)
    peers.register(this_process(3))
    peers.gone_now()        # {5}: rank 5's process on this host exited
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from typing import Callable

from lightning_ncclx.events.connection import StoreClient, StoreUnavailable
from lightning_ncclx.events.keys import gone_key, procs_key
from lightning_ncclx.events.liveness import ProcessInfo, is_gone, state_of, wait_status_of
from lightning_ncclx.events.wire import BadValue

MAX_PROCS_BYTES = 1 << 20
CACHE_SECONDS = 60.0
MAX_REFUSED_LINES = 8


class LocalPeers:
    def __init__(self, client: StoreClient, rank: int, world_size: int, refuse: Callable[[BadValue | str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.rank, self.world_size = client, rank, world_size
        self._refuse = refuse
        self._clock = clock
        self.me: ProcessInfo | None = None
        self._cached: dict[int, ProcessInfo] | None = None
        self._read_at = -CACHE_SECONDS
        self._reported: dict[int, set[int]] = {}
        self.exits: dict[int, int] = {}
        """Rank -> wait status of a peer found gone while it was still a zombie (its parent had not
        reaped it): how it ended, known only in that moment and only on its host."""

    def register(self, me: ProcessInfo | None) -> None:
        """Once per watchdog (None: this process cannot be checked, and checks nobody)."""
        if me is None or not me.scope:
            return
        line = json.dumps({k: v for k, v in asdict(me).items() if k != "scope"})
        self.client.append(procs_key(me.scope), line + "\n")
        self.me = me
        self._cached = None

    def peers(self, *, fresh: bool = False) -> dict[int, ProcessInfo]:
        """Rank -> process of every other rank registered in this scope (the latest line of each);
        ``fresh``: read now, not from the cache (a rank that registered a moment ago counts)."""
        if self.me is None:
            return {}
        if not fresh and self._cached is not None and self._clock() - self._read_at < CACHE_SECONDS:
            return self._cached
        try:
            raw = self.client.read(procs_key(self.me.scope)) or b""
        except StoreUnavailable:
            if self._cached is None:
                raise
            # the lines last read still name each process (a pid does not change): without the
            # store, /proc still tells whether the store's own host process is gone
            self._read_at = self._clock()
            return self._cached
        self._cached, self._read_at = self._parse(raw), self._clock()
        return self._cached

    def _parse(self, raw: bytes) -> dict[int, ProcessInfo]:
        assert self.me is not None
        if len(raw) > MAX_PROCS_BYTES:
            self._refuse(f"procs/{self.me.scope[:40]}: {len(raw)} bytes, over the cap: liveness unknown")
            return {}
        latest: dict[int, ProcessInfo] = {}
        refused = 0
        for line in raw.splitlines():
            if not line.strip():
                continue
            try:
                info = ProcessInfo.from_json(line, self.world_size)
            except BadValue as error:
                refused += 1
                if refused <= MAX_REFUSED_LINES:
                    self._refuse(error)
                continue
            if not info.scope:
                info = replace(info, scope=self.me.scope)
            if info.rank != self.rank and info.scope == self.me.scope:
                latest[info.rank] = info
        return latest

    def silent(self, ranks: list[int]) -> dict[int, tuple[ProcessInfo, str]]:
        """Of ``ranks``, those of this scope whose process is alive, with its ``/proc`` state letter."""
        out: dict[int, tuple[ProcessInfo, str]] = {}
        peers = self.peers()
        for r in ranks:
            info = peers.get(r)
            state = state_of(info) if info is not None else None
            if info is not None and state is not None:
                out[r] = (info, state)
        return out

    def gone_now(self) -> set[int]:
        return {r for r in list(self.peers()) if self.rank_gone(r)}

    def rank_gone(self, rank: int) -> bool:
        """True when ``rank``'s process is in this scope and gone (exited, or a zombie its parent
        has not reaped); any doubt, or a rank of another scope, reads as alive."""
        info = self.peers().get(rank)
        if info is None or not is_gone(info):
            return False
        if rank not in self.exits:
            status = wait_status_of(info)
            if status is not None:
                self.exits[rank] = status
        return True

    def report_gone(self, event_number: int) -> set[int]:
        """:meth:`gone_now`, the ones not reported yet appended to ``ev/<n>/gone`` for every rank."""
        gone = self.gone_now()
        reported = self._reported.setdefault(event_number, set())
        new = sorted(gone - reported)
        if new:
            self.client.append(gone_key(event_number), "".join(f"{r}\n" for r in new))
            reported.update(new)
        return gone

    def launcher_parent(self) -> ProcessInfo | None:
        ppid = os.getppid()
        return next((info for info in self.peers().values() if info.pid == ppid), None)
