"""The job-wide claim on an event's trigger alert, in the job's store (``ev/<n>/alert``): who
sends it, so that one process of the whole job does, even where the summarizing rank's host is
gone.

The record (:class:`ClaimRecord`, JSON, at most ``MAX_CLAIM_BYTES``) names a rank, a generation
and a state:

``armed``
    Written by the summarizing rank once the summary is written, with the trigger document it
    would send and within how many seconds it sends it (``claim_within_seconds``).
``sending``
    The rank named is delivering that document (generation 0: the summarizing rank; 1, 2 ...: a
    rank that took it over).
``done``
    The holder finished its attempts (sent, or kept in its alert file for ``alerts resend``).

The summarizing rank always sends its own alert and overwrites whatever the key holds: no value
in the store can hold it back. While a rank holds an armed or sending record it rewrites it every
``BEAT_SECONDS`` with the next ``beat`` (:meth:`ClaimBoard.beat`, ``compare_set`` on its own last
bytes, so a record another rank claimed meanwhile is left alone), for at most its hold (an armed
record: plus its ``claim_within_seconds``). Up to ``MAX_WATCHERS`` ranks spread over the job
(:func:`watchers`) watch the key of an event that their own heartbeat confirms: once the value
has not changed for ``LEASE_SECONDS`` (a record without beats: the holder's delivery deadline
plus ``TAKEOVER_MARGIN_SECONDS``, an armed one plus its ``claim_within_seconds``), on the
watcher's own monotonic clock, the holder is taken to be gone, and the watcher claims the next
generation with ``compare_set`` on the exact bytes it read: of several watchers, one wins; it
sends the same document (same ``alert_id``). The lease, not the delivery deadline, bounds how
long a dead holder goes unnoticed: well inside the grace a launcher that ends every rank gives
between its SIGTERM and its SIGKILL (30 s for torchrun, Slurm's default ``KillWait`` and
Kubernetes).

Values are hostile (any client of the store may write the key): a value that is not a record of
this event (not JSON, over the size cap, a rank outside the job, a document of another event)
is refused and counts as no record, never as a holder; a watcher keeps the last valid record it
read, and once it read a ``done`` record no value written after it starts a send there. What a
client of the store can still do: delay a takeover by rewriting the key, make a watcher send in
place of a live holder by planting a well-formed record before any watcher read ``done`` (the
same document twice, one ``alert_id``), and choose the document a watcher that takes over
sends.

Without the store (its server refused connections: it was the summarizing rank's process) no
record can be read or claimed; where that rank was alone on its host, the event's first watcher
sends in its place (:meth:`~lightning_ncclx.alerts.notifier.AlertNotifier.watch_claim`), with
:meth:`ClaimBoard.last_document` where it read one in time."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from lightning_ncclx.alerts.message import ALERT_SCHEMA, TEXT_LIMIT
from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.keys import alert_claim_key
from lightning_ncclx.events.wire import BadValue, as_int, json_object

log = logging.getLogger(__name__)

MAX_CLAIM_BYTES = 64 * 1024
MAX_GENERATION = 64
MAX_WATCHERS = 8
TAKEOVER_MARGIN_SECONDS = 5.0
"""Beyond the holder's delivery deadline, how long a claim must stay unchanged before it is taken over."""
BEAT_SECONDS = 2.0
"""How often a holder rewrites its armed or sending record."""
LEASE_SECONDS = 10.0
"""How long a record that beats may stay unchanged before its holder is taken to be gone: five beats."""
MAX_BEAT = 2**31
MAX_CLAIM_WITHIN_SECONDS = 24 * 3600.0
MAX_ID_CHARS = 512
STATES = ("armed", "sending", "done")


@dataclass(frozen=True)
class ClaimRecord:
    rank: int
    generation: int
    state: str
    document: dict[str, Any] | None = None
    claim_within_seconds: float = 0.0
    taken_from: int | None = None
    """Not in the store: the holder whose stale claim this one replaced (for the alert file)."""
    beat: int | None = None
    """How many times the holder rewrote the record (None: a record that does not beat)."""

    def encode(self) -> bytes:
        value: dict[str, Any] = {"rank": self.rank, "generation": self.generation, "state": self.state}
        if self.document is not None:
            value["document"] = self.document
        if self.state == "armed":
            value["claim_within_seconds"] = round(self.claim_within_seconds, 3)
        if self.beat is not None and self.state != "done":
            value["beat"] = self.beat
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes | None, world_size: int, event: str) -> "ClaimRecord":
        """The record in ``raw`` for ``event``; :class:`BadValue` when it is not one."""
        if raw is not None and len(raw) > MAX_CLAIM_BYTES:
            raise BadValue(f"{event}'s alert claim: {len(raw)} bytes, over {MAX_CLAIM_BYTES}")
        data = json_object(raw, MAX_CLAIM_BYTES, f"{event}'s alert claim")
        state = data.get("state")
        if state not in STATES:
            raise BadValue(f"{event}'s alert claim: state {str(state)[:40]!r} is not one of {', '.join(STATES)}")
        document = data.get("document")
        if document is not None:
            document = checked_document(document, event)
        elif state != "done":
            raise BadValue(f"{event}'s alert claim: a {state} record without its document")
        within = data.get("claim_within_seconds", 0.0)
        if isinstance(within, bool) or not isinstance(within, (int, float)) \
                or not 0.0 <= float(within) <= MAX_CLAIM_WITHIN_SECONDS:
            raise BadValue(f"{event}'s alert claim: claim_within_seconds is not a number of seconds in "
                           f"[0, {MAX_CLAIM_WITHIN_SECONDS:g}]")
        beat = data.get("beat")
        return cls(as_int(data.get("rank"), f"{event}'s alert claim rank", 0, world_size),
                   as_int(data.get("generation"), f"{event}'s alert claim generation", 0, MAX_GENERATION + 1),
                   str(state), document, float(within),
                   beat=None if beat is None else as_int(beat, f"{event}'s alert claim beat", 0, MAX_BEAT))

    @property
    def beats(self) -> bool:
        """The holder rewrites it while it lives: unchanged for ``LEASE_SECONDS``, it is gone."""
        return self.beat is not None and self.state != "done"


def _printable_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isascii() and value.isprintable()


def checked_document(document: Any, event: str) -> dict[str, Any]:
    """A trigger document read from the store, checked: it must be this event's trigger, with a
    printable ``alert_id`` that is its ``dedup_key`` + ``/trigger``; :class:`BadValue` otherwise."""
    if not isinstance(document, dict):
        raise BadValue(f"{event}'s alert claim: the document is not an object")
    if document.get("schema") != ALERT_SCHEMA or document.get("action") != "trigger" \
            or document.get("event") != event:
        raise BadValue(f"{event}'s alert claim: not this event's trigger document")
    key, alert = document.get("dedup_key"), document.get("alert_id")
    if not _printable_id(key) or alert != f"{key}/trigger":
        raise BadValue(f"{event}'s alert claim: alert_id is not '<dedup_key>/trigger' in printable ASCII")
    if not isinstance(document.get("text"), str) or len(document["text"]) > TEXT_LIMIT:
        raise BadValue(f"{event}'s alert claim: text is not a string of at most {TEXT_LIMIT} characters")
    return {k: v for k, v in document.items() if k != "severity"}  # a trigger's severity is the sink's


def watchers(initiator: int, world_size: int) -> list[int]:
    """The ranks that watch the claim of an event ``initiator`` summarizes: every other rank up
    to ``MAX_WATCHERS + 1`` ranks, else ``MAX_WATCHERS`` spread evenly over the job (ranks of one
    host are usually numbered together: a lost host takes few of them)."""
    if world_size - 1 <= MAX_WATCHERS:
        return [r for r in range(world_size) if r != initiator]
    step = world_size / (MAX_WATCHERS + 1)
    return sorted({(initiator + max(1, round(step * j))) % world_size for j in range(1, MAX_WATCHERS + 1)}
                  - {initiator})


@dataclass
class _Held:
    record: ClaimRecord
    """The bytes this rank last wrote (what its next beat compares against)."""
    until: float
    """When it stops beating it (the board's clock): a holder's work ends within its hold."""


@dataclass
class _Watched:
    raw: bytes | None = None
    since: float = 0.0
    """When this rank first read ``raw`` (its monotonic clock)."""
    last_valid: ClaimRecord | None = None
    finished: bool = False
    """This rank read a ``done`` record: nothing written after it starts a send here."""
    refused: set[bytes] = field(default_factory=set)
    quiet_for: float = 0.0
    """How long the record had stayed unchanged (past the confirmation) when this rank last judged it."""


class ClaimBoard:
    """One rank's side of the alert claims. Every store call is bounded by the client's timeout."""

    def __init__(self, client: StoreClient, rank: int, world_size: int, *,
                 clock: Callable[[], float] = time.monotonic, hold_seconds: float = 25.0) -> None:
        self.client, self.rank, self.world_size = client, rank, world_size
        self.hold_seconds = hold_seconds
        """How long a holder's work may take: its delivery deadline plus the margin."""
        self._clock = clock
        self._watched: dict[int, _Watched] = {}
        self._held: dict[int, _Held] = {}
        self._lock = threading.Lock()
        """Serializes this rank's writes of its own records (beats come from another thread)."""

    def arm(self, number: int, document: Mapping[str, Any], claim_within_seconds: float) -> None:
        """The summarizing rank: the trigger it will send within ``claim_within_seconds``."""
        within = min(MAX_CLAIM_WITHIN_SECONDS, max(0.0, claim_within_seconds))
        record = ClaimRecord(self.rank, 0, "armed", dict(document), within, beat=0)
        with self._lock:
            self._set(alert_claim_key(number), record.encode())
            self._held[number] = _Held(record, self._clock() + within + self.hold_seconds)

    def hold(self, number: int, document: Mapping[str, Any], generation: int = 0) -> ClaimRecord:
        """The summarizing rank, as it sends: the key says so, whatever it held."""
        record = ClaimRecord(self.rank, generation, "sending", dict(document), beat=0)
        with self._lock:
            self._set(alert_claim_key(number), record.encode())
            self._held[number] = _Held(record, self._clock() + self.hold_seconds)
        return record

    def beat(self) -> bool:
        """Rewrite each record this rank holds with its next beat; a record past its hold (kept,
        for :meth:`finish` to compare against), or that another rank claimed meanwhile, is no
        longer beaten. True while any is."""
        with self._lock:
            now = self._clock()
            for number, held in list(self._held.items()):
                if now >= held.until:
                    continue
                current = held.record.encode()
                following = replace(held.record, beat=(held.record.beat or 0) + 1)
                wanted = following.encode()
                if self.client.compare_set(alert_claim_key(number), current, wanted) == wanted:
                    held.record = following
                else:
                    del self._held[number]
                    log.info("[rank %d] the alert claim of event %d changed under it: no longer beaten here",
                             self.rank, number)
            return any(now < held.until for held in self._held.values())

    def holding(self) -> bool:
        """Some record of this rank is still beaten."""
        with self._lock:
            now = self._clock()
            return any(now < held.until for held in self._held.values())

    def release(self, number: int) -> None:
        """No trigger will be sent for event ``number`` from here (it recovered or expired): its
        record is no longer beaten (a watcher whose own heartbeat still confirms a hang takes it
        over after the lease)."""
        with self._lock:
            self._held.pop(number, None)

    def _keep(self, number: int, record: ClaimRecord | None) -> ClaimRecord | None:
        if record is not None:
            with self._lock:
                self._held[number] = _Held(record, self._clock() + self.hold_seconds)
        return record

    def _set(self, key: str, value: bytes) -> None:
        """``set`` gets no answer: the read after it returns once the server applied it."""
        self.client.set(key, value)
        self.client.read(key)

    def take_from(self, number: int, event: str, gone_rank: int | None, document: Mapping[str, Any]
                  ) -> ClaimRecord | None:
        """A rank of the gone sender's host takes its alert over: the next generation, claimed
        with ``compare_set`` unless the key names another holder or a finished alert."""
        key = alert_claim_key(number)
        raw = self.client.read(key)
        current = self._parse(raw, event)
        if current is not None and (current.state == "done" or current.rank != gone_rank):
            return None
        generation = 1 + (current.generation if current is not None else 0)
        return self._keep(number, self._compare_set(key, raw, ClaimRecord(self.rank, generation, "sending",
                                                                         dict(document), beat=0)))

    def watch(self, number: int, event: str, confirmed_at: float, hold_seconds: float,
              fallback: Callable[[], dict[str, Any]]) -> ClaimRecord | None:
        """A watcher, once per tick after its own heartbeat confirmed the event (at ``confirmed_at``,
        monotonic): the record it now holds when it claimed the alert of a holder that is gone
        (``hold_seconds``: how long a live holder may leave the key unchanged), else None.
        ``fallback``: the document to send where no valid record names one."""
        key = alert_claim_key(number)
        raw = self.client.read(key)
        now = self._clock()
        seen = self._watched.setdefault(number, _Watched(raw, now))
        if raw != seen.raw:
            seen.raw, seen.since = raw, now
        current = self._parse(raw, event, seen)
        if current is not None:
            seen.last_valid = current
        effective = current or seen.last_valid
        seen.finished = seen.finished or (effective is not None and effective.state == "done")
        if seen.finished:
            return None
        if effective is not None and effective.beats:
            wait = min(hold_seconds, LEASE_SECONDS)
        else:
            wait = hold_seconds + (effective.claim_within_seconds if effective and effective.state == "armed" else 0.0)
        seen.quiet_for = now - max(seen.since, confirmed_at)
        if seen.quiet_for < wait:
            return None
        generation = 1 + (effective.generation if effective is not None else 0)
        if generation > MAX_GENERATION:
            return None
        document = effective.document if effective is not None and effective.document else fallback()
        mine = self._compare_set(key, raw, ClaimRecord(self.rank, generation, "sending", document,
                                                       taken_from=effective.rank if effective is not None else None,
                                                       beat=0))
        if mine is None:
            seen.since = now  # another rank took it over a moment ago: judged from now on
        return self._keep(number, mine)

    def last_document(self, number: int) -> dict[str, Any] | None:
        """The document of the last valid record this rank read for event ``number`` (None when
        it read none, or read ``done``)."""
        seen = self._watched.get(number)
        if seen is None or seen.finished or seen.last_valid is None:
            return None
        return seen.last_valid.document

    def quiet_for(self, number: int) -> float:
        """How long event ``number``'s claim had stayed unchanged when this rank last judged it."""
        seen = self._watched.get(number)
        return seen.quiet_for if seen is not None else 0.0

    def now(self) -> float:
        """This board's clock (the watcher's monotonic one)."""
        return self._clock()

    def finish_here(self, number: int) -> None:
        """Nothing more is sent from this rank for event ``number``."""
        self._watched.setdefault(number, _Watched()).finished = True

    def finished(self, number: int) -> bool:
        """This rank read a ``done`` record for event ``number``."""
        seen = self._watched.get(number)
        return seen is not None and seen.finished

    def finish(self, number: int, held: ClaimRecord) -> None:
        """The holder finished its attempts; left alone when another rank holds the key now."""
        with self._lock:
            beaten = self._held.pop(number, None)
            last = beaten.record if beaten is not None and beaten.record.generation == held.generation else held
            done = ClaimRecord(self.rank, held.generation, "done").encode()
            self.client.compare_set(alert_claim_key(number), last.encode(), done)

    def _compare_set(self, key: str, raw: bytes | None, record: ClaimRecord) -> ClaimRecord | None:
        mine = record.encode()
        if len(mine) > MAX_CLAIM_BYTES:
            return None
        got = self.client.compare_set(key, raw if raw is not None else "", mine)
        return record if got == mine else None

    def _parse(self, raw: bytes | None, event: str, seen: _Watched | None = None) -> ClaimRecord | None:
        if raw is None:
            return None
        try:
            return ClaimRecord.parse(raw, self.world_size, event)
        except BadValue as error:
            if seen is None or raw not in seen.refused:
                if seen is not None and len(seen.refused) < 8:
                    seen.refused.add(raw[:MAX_CLAIM_BYTES])
                log.warning("[rank %d] store value refused: %s", self.rank, error)
            return None
