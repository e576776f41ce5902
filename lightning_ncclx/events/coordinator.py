"""How the ranks agree on one dump event and hand their dumps over, through the job's store.

Protocol (keys in :mod:`keys`, values in :mod:`wire`; every key under ``lightning_ncclx/``):

``ev/<n>/meta``
    :class:`~lightning_ncclx.events.wire.EventMeta`. A rank that wants an event proposes
    ``n = last event it saw + 1`` with ``compare_set(key, "", proposal)``: the first proposal
    wins and every concurrent proposer gets the winner's value back, so they agree on one event
    and one initiator (who also summarizes). A rank that was behind (it missed a ring) finds a
    closed or stale event there and moves on to the next number: it never joins an event that
    is over. Numbers taken by a value this protocol does not write are skipped.
``ev/<n>/rank/<r>``, ``ev/<n>/dumped``
    Rank ``r``'s :class:`~lightning_ncclx.events.wire.Announcement` (with its digest, zlib'd
    with a preset dictionary: ~300 bytes), then its number appended to the ``dumped`` roster: the
    initiator polls the roster (every 0.1 s per 4,096 ranks: :func:`roster_poll_seconds`), then
    reads every announcement it lists in a few ``multi_get`` requests.
``ev/<n>/blob/<r>`` (+ ``/<i>``)
    Rank ``r``'s full dump in chunks (:mod:`packing`): from every rank with
    ``gather_through_store``; in a two-phase gather only from the ranks in ``want``.
``ev/<n>/want``
    JSON list of the ranks whose full dumps the initiator asks for; it rings only their bells.
``ev/<n>/moved``
    Roster of the ranks whose heartbeat moved past the one the event was about.
``ev/<n>/outcome``
    :class:`~lightning_ncclx.events.wire.Outcome`: recovered, or the job ends with an exit
    status. Every rank's bell is rung.
``ev/<n>/leaving``
    Roster of the ranks on their way out of an ending job (the store's host leaves last).
``ev/<n>/gone``, ``procs/<scope>``
    Liveness (:mod:`liveness`, :mod:`local_peers`): lines naming ranks whose process exited; one
    JSON line per watchdog of a scope (boot id and pid namespace), read once per minute.
``bell/<r>``
    Rank ``r``'s doorbell (:mod:`doorbell`).

Once the summary is written the initiator marks ``meta`` closed and deletes the keys of the
collection (announcements, rosters, blobs); the store's host deletes the rest as the job ends;
``meta`` (about 100 bytes) stays as the event log that keeps numbering in step. Neither the
initiator nor the store's host waits for a rank whose process a rank of its host found gone.

Every read goes through :meth:`StoreClient.read` (never waits) or ``read_many`` on keys known to
exist; every value is validated (:mod:`wire`) and a bad one is left out with a note in
:attr:`EventCoordinator.refused`, never trusted and never fatal.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Callable

from lightning_ncclx.events.connection import StoreClient, StoreUnavailable, address_is_local
from lightning_ncclx.events.doorbell import ring
from lightning_ncclx.events.keys import (
    gone_key, meta_key, outcome_key, pulse_key, rank_key, roster_key, want_key,
)
from lightning_ncclx.events.liveness import ProcessInfo
from lightning_ncclx.events.local_peers import LocalPeers
from lightning_ncclx.events.packing import blob_keys, put_blob
from lightning_ncclx.events.wire import (
    MAX_META_BYTES, Announcement, BadValue, EventMeta, Outcome, parse_rank_lines, parse_rank_list,
)

log = logging.getLogger(__name__)

MAX_PULSE_BYTES = 64

MAX_SKIPPED_PER_CALL = 64
"""Event numbers a call looks past (closed, stale or planted) before it gives up until the next."""
MAX_REFUSED_KEPT = 200
TRIES_AFTER_JUMP = 4
"""Numbers a call tries one by one after jumping to the end of a run of taken ones."""
MAX_JUMP = 1 << 40
MAX_EVENTS_TIMED = 256
CLOCK_SKEW_SECONDS = 60.0
"""A new event's opening time this far from this host's clock is named as clock skew in the log."""
"""How far past the last event seen a run of taken numbers is followed (40 reads at most)."""
SILENT_RANK_GRACE_SECONDS = 0.5
"""Once every other rank dumped, how much longer a rank the detection found silent is waited for."""


def roster_poll_seconds(world_size: int) -> float:
    """How often a roster of the whole job is read while it fills: every 0.1 s up to 4,096 ranks,
    then less often in proportion (a 16,384-rank roster is ~100 KB a read)."""
    return 0.1 * max(1.0, world_size / 4096)


class EventCoordinator:
    """The store side of dump events for one rank. Thread: the watchdog's (or main on exception)."""

    def __init__(self, client: StoreClient, rank: int, world_size: int, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wall_clock: Callable[[], float] = time.time, stale_after_seconds: float = 600.0) -> None:
        self.client = client
        self.rank = rank
        self.world_size = world_size
        self.last_seen = 0
        self.name_taken: Callable[[str], bool] = lambda name: False
        """Set by the owner: True when an event folder of that name exists (an earlier run)."""
        self.rings_doorbells = False
        """Set by the owner where ranks listen for changes (:mod:`doorbell`) instead of polling."""
        self.serves_store = False
        """Set by the owner: this process is the job's store server (rank 0 under Lightning's
        launcher, SLURM and ``mp.spawn``; under torchrun the agent serves it)."""
        self.store_host_address: str | None = None
        """Set by the owner: the address the job's store listens at (:meth:`on_store_host`)."""
        self.store_port: int | None = None
        """Set by the owner where a launcher agent serves the store (torchrun): its port, to find
        whether this rank's own agent is the one (:meth:`_launched_by_store_server`)."""
        self._parent_serves: bool | None = None
        self._on_store_host: bool | None = None
        self.stale_after_seconds = stale_after_seconds
        """An event still open this long after it was proposed lost its initiator: not joined."""
        self.refused: list[str] = []
        """Store values this rank refused (planted or corrupt), newest last, for the logs."""
        self._clock = clock
        self._sleep = sleep
        self._wall_clock = wall_clock
        self._first_seen: dict[int, float] = {}
        """Event number -> when this rank first saw it open, on its own monotonic clock."""
        self._seen_free: int | None = None
        """The last event number this rank read as free: an event found there later is new."""
        self.local = LocalPeers(client, rank, world_size, self.refuse, clock)

    def refuse(self, error: BadValue | str) -> None:
        text = str(error)
        if len(self.refused) < MAX_REFUSED_KEPT:
            self.refused.append(text)
        log.warning("[rank %d] store value refused: %s", self.rank, text)

    # ------------------------------------------------------------------ which event
    def _meta(self, number: int) -> EventMeta | None | BadValue:
        raw = self.client.read(meta_key(number))
        if raw is None:
            return None
        try:
            return EventMeta.parse(number, raw, self.world_size)
        except BadValue as error:
            return error

    def _is_over(self, meta: EventMeta) -> bool:
        """Closed, or open for longer than an initiator would take (it died mid-event).

        How long it has been open is judged on this rank's own monotonic clock, from when it
        first saw the event, wherever the event is known to be new (this rank read its number as
        free before): hosts' wall clocks may disagree by minutes. Only an event met with no such
        sign (at setup) is judged by its opening time, against this host's wall clock."""
        if meta.closed:
            return True
        if meta.number == self._seen_free or meta.number in self._first_seen:
            if meta.number not in self._first_seen:
                self._first_seen[meta.number] = self._clock()
                self._name_skew(meta)
                while len(self._first_seen) > MAX_EVENTS_TIMED:
                    del self._first_seen[next(iter(self._first_seen))]
            return self._clock() - self._first_seen[meta.number] > self.stale_after_seconds
        return meta.opened is not None and self._wall_clock() - meta.opened > self.stale_after_seconds

    def _name_skew(self, meta: EventMeta) -> None:
        if meta.opened is None:
            return
        skew = self._wall_clock() - meta.opened
        if abs(skew) > CLOCK_SKEW_SECONDS:
            log.warning("[rank %d] %s was opened at %.0f by the clock of rank %d's host, %.0f s %s this host's clock: "
                        "clock skew between the hosts; the event is judged by this rank's own clock", self.rank,
                        meta.name, meta.opened, meta.initiator, abs(skew), "behind" if skew > 0 else "ahead of")

    def propose(self, reason: str) -> EventMeta | None:
        """Ask for an event; returns the one agreed on (this rank's, or a concurrent proposer's that is
        still being collected), or None when no number could be taken in this call."""
        alone, host_ranks = self._host_facts()  # one read per call, however many numbers are taken
        for tried in range(MAX_SKIPPED_PER_CALL + TRIES_AFTER_JUMP):
            if tried == MAX_SKIPPED_PER_CALL:
                self._jump_past_taken()
            number = self.last_seen + 1
            mine = EventMeta.new(number, reason, self.rank, self._wall_clock(), self._free_name(reason, number),
                                 alone=alone, store_host=self.on_store_host(), host_ranks=host_ranks)
            proposal = mine.to_json()
            raw = self.client.compare_set(meta_key(number), "", proposal)
            self.last_seen = number
            if raw == proposal.encode():
                if self.rings_doorbells:
                    self._ring_all(mine, "start")
                return mine
            try:
                agreed = EventMeta.parse(number, raw, self.world_size)
            except BadValue as error:
                self.refuse(error)
                continue
            if self._is_over(agreed):
                log.info("[rank %d] event %d (%s) is already over: proposing the next one", self.rank, number,
                         agreed.name)
                continue
            return agreed
        log.warning("[rank %d] no event number free up to %d: no dump now, trying again at the next poll", self.rank,
                    self.last_seen)
        return None

    def _host_facts(self) -> tuple[bool, tuple[int, ...]]:
        """Whether this rank serves the store, or was launched by the process that does (torchrun's
        agent), with no other rank registered on its host, and, on the store's host, the other
        ranks registered there (read now)."""
        if not self.on_store_host() or self.local.me is None:
            return False, ()
        try:
            peers = tuple(self.local.peers(fresh=True))
        except StoreUnavailable:
            return False, ()
        return (self.serves_store or self._launched_by_store_server()) and not peers, peers

    def _launched_by_store_server(self) -> bool:
        """This rank's parent process (torchrun's agent) serves the job's store: it closes the
        store only once its ranks are gone. Found once, from ``/proc``."""
        if self._parent_serves is None:
            from lightning_ncclx.events.liveness import listens_on

            self._parent_serves = self.store_port is not None and listens_on(os.getppid(), self.store_port)
        return self._parent_serves

    def on_store_host(self) -> bool:
        """This rank runs on the host that serves the job's store (its own process or its host's
        launcher agent). Found once, on the watchdog's thread (a host name may need a lookup)."""
        if self.serves_store:
            return True
        if self._on_store_host is None:
            self._on_store_host = self.store_host_address is not None and address_is_local(self.store_host_address)
        return self._on_store_host

    def _taken(self, number: int) -> bool:
        return self.client.check([meta_key(number)])

    def _jump_past_taken(self) -> None:
        """``last_seen`` moved to just before the last number of the run of taken numbers that
        follows it, found in reads logarithmic in the run's length (doubling, then halving): a
        store client may plant any number of closed events. That last number is then read as
        usual (an event still being collected there is joined)."""
        low, step = self.last_seen, 1
        while step < MAX_JUMP and self._taken(low + step):
            low, step = low + step, 2 * step
        high = low + step
        while high - low > 1:
            middle = (low + high) // 2
            if self._taken(middle):
                low = middle
            else:
                high = middle
        if low > self.last_seen:
            log.warning("[rank %d] event numbers %d to %d are taken (planted values?): looking past them", self.rank,
                        self.last_seen + 1, low)
            self.last_seen = low - 1

    def _free_name(self, reason: str, number: int) -> str | None:
        from lightning_ncclx.events.keys import event_name

        name = event_name(reason, number, self.rank)
        try:
            if self.name_taken(name):
                return f"{name}-{int(self._wall_clock())}"
        except Exception:  # noqa: BLE001 - an unreadable dump folder: the plain name
            log.debug("checking the event folder %s failed", name, exc_info=True)
        return None

    def _ring_all(self, meta: EventMeta, what: str) -> None:
        try:
            ring(self.client, range(self.world_size), f"{meta.number}:{what}")
        except Exception:  # noqa: BLE001 - the others still poll after a lost ring
            log.warning("[rank %d] ringing the other ranks for event %d failed", self.rank, meta.number,
                        exc_info=True)

    def skip_past_events(self) -> int:
        """Start after the events in the store that are over, and return how many there were.

        ``trainer.validate`` or a second ``fit`` after a fit keeps the process group and its
        store, but starts a new watchdog: without this it would take the earlier events for
        new ones and dump every rank again, over the earlier dump. An event still being
        collected is not stepped past: it may have started before this watchdog first reached
        the store, and this rank's dump belongs to it."""
        start = self.last_seen
        for tried in range(MAX_SKIPPED_PER_CALL + TRIES_AFTER_JUMP):
            if tried == MAX_SKIPPED_PER_CALL:
                self._jump_past_taken()
            meta = self._meta(self.last_seen + 1)
            if meta is None:
                self._seen_free = self.last_seen + 1
                break
            if isinstance(meta, EventMeta) and not self._is_over(meta):
                break
            self.last_seen += 1
        return self.last_seen - start

    def poll(self) -> EventMeta | None:
        """The next event another rank started and is still collecting, if any (one non-blocking
        read per event number; events that are over are stepped past)."""
        for tried in range(MAX_SKIPPED_PER_CALL + TRIES_AFTER_JUMP):
            if tried == MAX_SKIPPED_PER_CALL:
                self._jump_past_taken()
            number = self.last_seen + 1
            meta = self._meta(number)
            if meta is None:
                self._seen_free = number
                return None
            self.last_seen = number
            if isinstance(meta, BadValue):
                self.refuse(meta)
                continue
            if self._is_over(meta):
                log.info("[rank %d] event %s is already over: not joined", self.rank, meta.name)
                continue
            return meta
        return None

    def is_closed(self, event: EventMeta) -> bool:
        """True once the initiator has written the summary and cleared the event's keys."""
        meta = self._meta(event.number)
        return isinstance(meta, EventMeta) and meta.closed

    # ------------------------------------------------------------------ dumps in
    def announce(self, event: EventMeta, announcement: Announcement, upload: list[Path] | None = None) -> bool:
        """Tell the initiator where this rank's dump is (its digest inside, in a two-phase
        gather; ``upload``: also send these files whole). A rank that dumps after the summary
        was written keeps its dump on disk and adds no keys; False then."""
        if event.initiator != self.rank and self.is_closed(event):
            log.info("[rank %d] %s is already summarized: this rank's dump stays in %s", self.rank, event.name,
                     announcement.folder)
            return False
        if upload and self.upload_full(event, upload):
            announcement = dataclasses.replace(announcement, uploaded=True)
        self.client.set(rank_key(event.number, self.rank), announcement.encode())
        self.join_roster(event, "dumped")
        if event.initiator != self.rank and self.is_closed(event):  # closed while this rank announced
            self.client.delete([rank_key(event.number, self.rank)] + blob_keys(event.number, self.rank))
        return True

    def upload_full(self, event: EventMeta, files: list[Path]) -> bool:
        from lightning_ncclx.events.packing import pack_files

        try:
            return put_blob(self.client, event.number, self.rank, pack_files(files))
        except Exception:  # noqa: BLE001 - the initiator then names this rank's dump as kept on its host
            log.warning("[rank %d] sending the dump of %s through the store failed", self.rank, event.name,
                        exc_info=True)
            return False

    def join_roster(self, event: EventMeta, name: str) -> None:
        self.client.append(roster_key(event.number, name), f"{self.rank}\n")

    def roster(self, event: EventMeta, name: str) -> list[int]:
        """The ranks of the job on roster ``name`` (planted lines refused)."""
        ranks, notes = parse_rank_lines(self.client.read(roster_key(event.number, name)), self.world_size,
                                        f"{event.name}'s {name} roster")
        for note in notes:
            self.refuse(note)
        return ranks

    def announced(self, event: EventMeta) -> dict[int, Announcement]:
        """Every rank's announcement (each checked; bad ones refused): those the ``dumped``
        roster lists in a few ``multi_get`` requests, the others one non-blocking read each (a
        roster overwritten by another client must not hide the ranks it no longer lists)."""
        listed = self.roster(event, "dumped")
        others = [r for r in range(self.world_size) if r not in set(listed)]
        values = self.client.read_many([rank_key(event.number, r) for r in listed])
        values += [self.client.read(rank_key(event.number, r)) for r in others]
        found: dict[int, Announcement] = {}
        for rank, raw in zip(listed + others, values):
            if raw is None:
                continue
            try:
                found[rank] = Announcement.parse(rank, raw)
            except BadValue as error:
                self.refuse(error)
        return dict(sorted(found.items()))

    def wait_for_dumps(self, event: EventMeta, timeout_seconds: float, poll_seconds: float | None = None,
                       liveness_every_seconds: float = 0.5,
                       silent_ranks: frozenset[int] = frozenset()) -> dict[int, Announcement]:
        """Rank -> its announcement, once every rank announced (or is gone: its process exited)
        or the deadline passed. ``silent_ranks`` (their watchdog could not run when the event was
        detected) are waited for only ``SILENT_RANK_GRACE_SECONDS`` after every other rank."""
        poll_seconds = roster_poll_seconds(self.world_size) if poll_seconds is None else poll_seconds
        deadline = self._clock() + timeout_seconds
        next_liveness = self._clock()
        while self._clock() < deadline:
            dumped = set(self.roster(event, "dumped"))
            count = len(dumped)
            if count >= self.world_size:
                break
            if silent_ranks and len(dumped | silent_ranks) >= self.world_size:
                deadline = min(deadline, self._clock() + SILENT_RANK_GRACE_SECONDS)
                silent_ranks = frozenset()
            if self._clock() >= next_liveness:
                next_liveness = self._clock() + liveness_every_seconds
                try:
                    if count + self._missing_but_gone(event) >= self.world_size:
                        break
                except Exception:  # noqa: BLE001 - without liveness, wait for the deadline
                    log.warning("[rank %d] checking for exited ranks failed; waiting for every dump instead",
                                self.rank, exc_info=True)
                    next_liveness = deadline  # once per event, not every poll
            self._sleep(poll_seconds)
        return self.announced(event)

    # ------------------------------------------------------------------ two-phase: full dumps wanted
    def request_full_dumps(self, event: EventMeta, ranks: list[int]) -> None:
        """Initiator, two-phase gather: ask these ranks for their whole dumps (their bells ring)."""
        self.client.set(want_key(event.number), f"[{', '.join(str(r) for r in sorted(ranks))}]")
        if self.rings_doorbells and ranks:
            ring(self.client, sorted(ranks), f"{event.number}:want")

    def wanted(self, event: EventMeta) -> list[int] | None:
        """The ranks the initiator asked for (None: not asked yet, or a value it did not write)."""
        raw = self.client.read(want_key(event.number))
        if raw is None:
            return None
        try:
            return parse_rank_list(raw, self.world_size, f"{event.name}'s wanted ranks")
        except BadValue as error:
            self.refuse(error)
            return None

    # ------------------------------------------------------------------ after the summary
    def set_outcome(self, event: EventMeta, outcome: Outcome) -> None:
        self.client.set(outcome_key(event.number), outcome.to_json())
        if self.rings_doorbells:
            self._ring_all(event, "outcome")

    def outcome(self, event: EventMeta, allowed_codes: set[int], kinds: tuple[str, ...]) -> Outcome | None:
        raw = self.client.read(outcome_key(event.number))
        if raw is None:
            return None
        try:
            return Outcome.parse(raw, allowed_codes, kinds)
        except BadValue as error:
            self.refuse(error)
            return None

    def set_pulse(self, event: EventMeta, count: int) -> None:
        """The initiator's sign of life for ``event`` (see :func:`~lightning_ncclx.events.keys.pulse_key`)."""
        self.client.set(pulse_key(event.number), str(count))

    def pulse(self, event: EventMeta) -> bytes | None:
        """The initiator's latest sign of life, as raw bytes, at most ``MAX_PULSE_BYTES``: only
        compared, never parsed (what another client can do with it: :mod:`~lightning_ncclx.watchdog.initiator_pulse`)."""
        raw = self.client.read(pulse_key(event.number))
        return None if raw is None else raw[:MAX_PULSE_BYTES]

    def close(self, event: EventMeta, announced: dict[int, Announcement], blobs_from: list[int]) -> None:
        """Initiator, once the summary is written: mark the event closed, then delete the keys of
        the collection (the dumps are on disk now; blobs are the store host's biggest memory)."""
        self.client.set(meta_key(event.number), event.to_json(closed=True))
        keys = [roster_key(event.number, "dumped"), gone_key(event.number), want_key(event.number)]
        keys += [rank_key(event.number, r) for r in sorted(announced)]
        for rank in sorted(set(blobs_from) | {r for r, a in announced.items() if a.uploaded}):
            keys += self._blob_keys_in_use(event, rank)
        self.client.delete(keys)

    def _blob_keys_in_use(self, event: EventMeta, rank: int) -> list[str]:
        from lightning_ncclx.events.packing import read_manifest

        keys = blob_keys(event.number, rank, chunks=0)
        try:
            chunks, _ = read_manifest(self.client.read(keys[0]), rank)
        except BadValue:
            return keys
        return blob_keys(event.number, rank, chunks=chunks)

    def forget(self, event: EventMeta) -> None:
        """The store's host, as the job ends: the keys every rank used after the summary."""
        self.client.delete([roster_key(event.number, "moved"), roster_key(event.number, "leaving"),
                            outcome_key(event.number), gone_key(event.number), pulse_key(event.number)])

    def leaving(self, event: EventMeta, timeout_seconds: float, poll_seconds: float | None = None) -> None:
        """Say this rank exits; the store's host (rank 0) waits for the others first, so their
        last store calls do not hit a closed server."""
        self.join_roster(event, "leaving")
        if self.rank != 0:
            return
        poll_seconds = roster_poll_seconds(self.world_size) if poll_seconds is None else poll_seconds
        deadline = self._clock() + timeout_seconds
        next_liveness = self._clock() + 0.5
        leaving: set[int] = set()
        while self._clock() < deadline:
            leaving = set(self.roster(event, "leaving"))
            if len(leaving) >= self.world_size:
                return
            if self._clock() >= next_liveness:  # an exited process says nothing: not waited for
                next_liveness = self._clock() + 0.5
                gone = (self.local.gone_now() | self.gone_ranks(event)) - leaving
                if len(leaving | gone) >= self.world_size:
                    log.info("[rank %d] %s: not waiting for rank(s) %s to leave: their process is gone", self.rank,
                             event.name, sorted(gone))
                    return
            self._sleep(poll_seconds)
        missing = sorted(set(range(self.world_size)) - leaving)
        log.warning("[rank %d] %s: rank(s) %s did not say they leave within %.0f s: leaving without them", self.rank,
                    event.name, missing[:16], timeout_seconds)

    # ------------------------------------------------------------------ processes that are gone
    def register_process(self, me: ProcessInfo | None) -> None:
        """Once per watchdog: lets the other ranks of ``me.scope`` check on this process (None:
        this process cannot be checked, and checks nobody)."""
        self.local.register(me)

    def silent_local_ranks(self, ranks: list[int]) -> dict[int, tuple[ProcessInfo, str]]:
        """Of ``ranks`` (that did not dump), those of this scope whose process is alive, with its
        ``/proc`` state letter: alive, yet its watchdog never answered."""
        return self.local.silent(ranks)

    def check_local_peers(self, event: EventMeta) -> set[int]:
        """Ranks of this host whose process is gone (newly found ones are reported to all)."""
        return self.local.report_gone(event.number)

    def local_process_gone(self, rank: int) -> bool:
        """``rank``'s process is on this host (this scope) and gone: exited, or a zombie."""
        return self.local.rank_gone(rank)

    def announce_initiator_gone(self, event: EventMeta) -> None:
        """A rank of the initiator's host found its process gone: the gone ranks say so to every
        rank, and every bell rings (the initiator may have died between writing the outcome and
        ringing), so no rank waits for an answer that cannot come."""
        self.local.report_gone(event.number)
        if self.rings_doorbells:
            self._ring_all(event, "outcome")

    def gone_ranks(self, event: EventMeta) -> set[int]:
        """Every rank some rank of its host reported gone during ``event``."""
        ranks, notes = parse_rank_lines(self.client.read(gone_key(event.number)), self.world_size, "gone ranks")
        for note in notes:
            self.refuse(note)
        return set(ranks)

    def _missing_but_gone(self, event: EventMeta) -> int:
        self.check_local_peers(event)
        gone = sorted(self.gone_ranks(event))
        if not gone:
            return 0
        announced = set(self.roster(event, "dumped"))
        return sum(1 for r in gone if r not in announced)

    def launcher_parent(self) -> ProcessInfo | None:
        """The rank whose process started this one, if any: Lightning's own launcher runs local
        rank 0 in the launching process and the other local ranks as its children. That parent
        has to exit first, or its child-process observer SIGKILLs it (and the job reports -9)
        as soon as it sees a child exit."""
        return self.local.launcher_parent()


__all__ = ["EventCoordinator", "MAX_META_BYTES"]
