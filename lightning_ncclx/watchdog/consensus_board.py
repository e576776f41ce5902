"""The consensus's store side: one rank's :class:`OverrunNotice`, and rank 0's :class:`Picture` of
all of them (the protocol is described in :mod:`consensus`). Every value read from the store is
another process's bytes: a malformed notice counts as none."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lightning_ncclx.events.doorbell import ring
from lightning_ncclx.events.wire import BadValue, as_finite, as_int, as_text, json_object
from lightning_ncclx.watchdog.collective_probe import BlockedIn

CHANGES_KEY = "cs/changes"
"""The board's change log: ``=<changes>:<posted>`` then one byte per change since (``+`` a first
post, ``.`` a changed notice, ``-`` a withdrawal), appended (never ``add``: another client's value
there would cost the connection of every rank that posts). Counts read from it are hints that
decide when to read the notices; what a picture says comes from the notices alone."""
MAX_LOG_BYTES = 4096
"""A log longer than this is folded into its header (one ``compare_set``) by the rank that decides."""
PING_KEY = "cs/ping"
MAX_NOTICE_BYTES = 64 * 1024
MAX_BLOCKED_LISTED = 16
ALIGNED_COUNTER_BACKENDS = frozenset({"gloo"})
"""Recorders whose per-group op counter counts collectives only (gloo records no send or recv),
so the same op number is the same collective on every member. NCCL's counts p2p ops too: there
one rank's op number says nothing about another's."""


def notice_key(rank: int) -> str:
    return f"cs/rank/{rank}"


def answer_key(rank: int) -> str:
    """The last ping number rank ``rank``'s watchdog answered."""
    return f"cs/answer/{rank}"


@dataclass(frozen=True, order=True)
class P2PWait:
    """A send or recv a rank has in flight, as its notice says it."""

    backend: str
    group: str
    op_id: int
    op: str
    """``send`` or ``recv``."""
    peer: int
    """Global rank of the other side; -1 unknown (a recv from any source)."""

    def label(self) -> str:
        other = f"rank {self.peer}" if self.peer >= 0 else "any rank"
        return f"{self.op} {'to' if self.op == 'send' else 'from'} {other} ({self.backend} group {self.group})"


@dataclass(frozen=True)
class OverrunNotice:
    """What one rank says while its step has overrun ``wait``."""

    rank: int
    beat: int
    """The heartbeat this notice belongs to (a new heartbeat withdraws it)."""
    step: int
    blocked: tuple[BlockedIn, ...]
    """The collectives it waits in."""
    waited_seconds: float
    """Since the heartbeat, when posted (not compared: a notice is not re-posted as time passes)."""
    working: bool = False
    """Its main thread busy on a CPU (see ``WORKING_CPU_SHARE``); the picture counts it only for a
    rank it finds outside any collective."""
    p2p: tuple[P2PWait, ...] = ()
    """The sends and recvs it waits in. Both empty: busy outside any (compute, data loader, host code)."""

    def same_as(self, other: "OverrunNotice | None") -> bool:
        return other is not None and (self.rank, self.beat, self.blocked, self.p2p, self.working) == (
            other.rank, other.beat, other.blocked, other.p2p, other.working)

    def to_json(self) -> str:
        return json.dumps({"rank": self.rank, "beat": self.beat, "step": self.step,
                           "blocked": [[b.backend, b.pg_id, b.op_id] for b in self.blocked[:MAX_BLOCKED_LISTED]],
                           "p2p": [[w.backend, w.group, w.op_id, w.op, w.peer] for w in self.p2p[:MAX_BLOCKED_LISTED]],
                           "waited": round(self.waited_seconds, 3), "working": self.working})

    @classmethod
    def from_json(cls, raw: bytes | str, world_size: int = 1 << 20) -> "OverrunNotice | None":
        """None for an empty or malformed value (another writer's bytes are not trusted: shapes,
        ints and finite numbers are checked, sizes capped before parsing)."""
        if not raw:
            return None
        try:
            data = json_object(raw, MAX_NOTICE_BYTES, "consensus notice")
            blocked_raw, p2p_raw = data.get("blocked"), data.get("p2p") or []
            if not isinstance(blocked_raw, list) or not isinstance(p2p_raw, list):
                return None
            blocked = tuple(BlockedIn(as_text(b[0], "backend", 64), as_text(b[1], "group", 256),
                                      as_int(b[2], "op", 0, 1 << 62)) for b in blocked_raw[:MAX_BLOCKED_LISTED])
            p2p = tuple(P2PWait(as_text(w[0], "backend", 64), as_text(w[1], "group", 256), as_int(w[2], "op", 0, 1 << 62),
                                as_text(w[3], "p2p op", 8), as_int(w[4], "peer", -1, world_size))
                        for w in p2p_raw[:MAX_BLOCKED_LISTED])
            working = data.get("working", False)
            return cls(rank=as_int(data.get("rank"), "rank", 0, world_size), beat=as_int(data.get("beat"), "beat", 0, 1 << 62),
                       step=as_int(data.get("step"), "step", 0, 1 << 62), blocked=blocked,
                       waited_seconds=as_finite(data.get("waited"), "waited", 0.0, 1e9), working=working is True,
                       p2p=p2p)
        except (BadValue, TypeError, KeyError, IndexError, AttributeError):
            return None


@dataclass(frozen=True)
class Picture:
    """Every rank's notice as rank 0 read them."""

    world_size: int
    notices: dict[int, OverrunNotice]
    unanswered: tuple[int, ...] = ()
    """Ranks without a notice whose watchdog did not answer rank 0's ping (see ``SILENCE_SECONDS``
    of :mod:`consensus`): it cannot run (GIL held in native code, process stopped)."""

    @cached_property
    def blocked(self) -> dict[int, tuple[BlockedIn | P2PWait, ...]]:
        """rank -> where it waits (collectives, then point-to-point ops), for the ranks that wait.

        A gloo collective that another member of its group has already moved past is left out:
        that member completed it, so every member took part, and nothing is left to wait for in
        it. A rank's recorder can still show it unfinished for a while (seen on loaded hosts, with
        that rank's main thread long since elsewhere); where it waits, if anywhere, is not there."""
        latest: dict[tuple[str, str], int] = {}
        for notice in self.notices.values():
            for b in notice.blocked:
                if b.backend in ALIGNED_COUNTER_BACKENDS:
                    latest[(b.backend, b.pg_id)] = max(latest.get((b.backend, b.pg_id), b.op_id), b.op_id)
        out: dict[int, tuple[BlockedIn | P2PWait, ...]] = {}
        for r, notice in sorted(self.notices.items()):
            current = tuple(b for b in notice.blocked if b.op_id >= latest.get((b.backend, b.pg_id), b.op_id))
            if current or notice.p2p:
                out[r] = (*current, *notice.p2p)
        return out

    @property
    def busy(self) -> list[int]:
        return sorted(r for r in self.notices if r not in self.blocked)

    @property
    def working(self) -> list[int]:
        return sorted(r for r, n in self.notices.items() if n.working and r not in self.blocked)

    @property
    def silent(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.notices]

    def is_hang(self, quorum: float) -> bool:
        """Every rank posted (a rank in a phase that explains a long wait never does) or did not
        answer a ping (its watchdog cannot run), none is working, and at least ``quorum`` of them
        wait in a collective or a send/recv."""
        if set(self.silent) - set(self.unanswered) or self.working or self.world_size < 1:
            return False
        return len(self.blocked) >= max(1, math.ceil(quorum * self.world_size - 1e-9))

    def describe(self) -> str:
        groups: dict[tuple, list[int]] = {}
        for r, where in self.blocked.items():
            groups.setdefault(where, []).append(r)
        parts = [f"rank(s) {_ranks(rs)} blocked in {', '.join(w.label() for w in where)}"
                 for where, rs in sorted(groups.items(), key=lambda item: item[1][0])]
        idle = [r for r in self.busy if r not in self.working]
        if idle:
            waited = max(self.notices[r].waited_seconds for r in idle)
            parts.append(f"rank(s) {_ranks(idle)} outside any collective, waiting (step overran by {waited:.1f} s+)")
        if self.working:
            parts.append(f"rank(s) {_ranks(self.working)} outside any collective, working")
        if self.unanswered:
            parts.append(f"rank(s) {_ranks(list(self.unanswered))} silent: posted nothing and their watchdog "
                         "did not answer (GIL held in native code, process stopped, node unreachable)")
        return "; ".join(parts)


def _ranks(ranks: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


class ConsensusBoard:
    """The store side: one rank's notice, and rank 0's reading of all of them."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.posted: OverrunNotice | None = None
        self.posts = 0
        self.rings_doorbells = False
        """Set by the owner where every rank listens on its doorbell: a ping rings the bells of
        the ranks asked (without doorbells every rank reads the ping key at each poll)."""
        self.answered_ping = 0

    def start(self) -> None:
        """An empty notice, so that rank 0 can read every rank's key in one request."""
        self.store.set(notice_key(self.rank), "")

    def post(self, notice: OverrunNotice) -> None:
        self.store.set(notice_key(self.rank), notice.to_json())
        self.store.append(CHANGES_KEY, "." if self.posted is not None else "+")
        self.posted = notice
        self.posts += 1

    def withdraw(self) -> None:
        """The ``-`` goes into the log before the notice is cleared, so that a recount made while
        a withdrawal is under way can only count too many posted notices, never too few."""
        if self.posted is None:
            return
        self.store.append(CHANGES_KEY, "-")
        self.store.set(notice_key(self.rank), "")
        self.posted = None

    def stop(self) -> None:
        self.withdraw()
        self.store.delete_key(notice_key(self.rank))
        if self.answered_ping:
            self.store.delete_key(answer_key(self.rank))

    def ping(self, ranks: tuple[int, ...]) -> int:
        """Rank 0: ask ``ranks`` whether their watchdog runs; the new ping number (set, not
        added: a value another client planted must not fail the request)."""
        number = max(0, _as_count(self.store.read(PING_KEY)) or 0) + 1
        self.store.set(PING_KEY, str(number))
        if self.rings_doorbells and ranks:
            ring(self.store, ranks, f"ping:{number}")
        return number

    def answer_ping(self) -> None:
        """Any rank, when its bell rang (or at every poll without a doorbell): answer the latest
        ping. Another client's value is only echoed back (it can hide a silent rank, never invent one)."""
        number = _as_count(self.store.read(PING_KEY))
        if number and number != self.answered_ping:
            self.store.set(answer_key(self.rank), str(number))
            self.answered_ping = number

    def answered(self, ranks: tuple[int, ...], number: int) -> bool:
        """True when any of ``ranks`` answered ping ``number`` (or a later one)."""
        values = self.store.read_many([answer_key(r) for r in ranks])
        return any((_as_count(raw) or 0) >= number for raw in values if raw is not None)

    def counters(self) -> tuple[int, int]:
        """(ranks with a notice, changes so far) from one read of the change log. Both are hints:
        too many posted only makes the decider read the notices, and a value another client wrote
        there is read as bytes (never fails a request). A log over ``MAX_LOG_BYTES`` is folded into
        its header with a recount of the notices."""
        raw = self.store.read(CHANGES_KEY) or b""
        base_changes, base_posted, body = _split_log(raw)
        posted = max(0, base_posted + body.count(b"+") - body.count(b"-"))
        changes = base_changes + len(body)
        if len(body) > MAX_LOG_BYTES:
            recounted = sum(1 for n in self._read_notices().values() if n is not None)
            # the swap fails when a rank appended since the read: folded at a later poll
            self.store.compare_set(CHANGES_KEY, raw, _log_header(changes, recounted))
        return posted, changes

    def _read_notices(self) -> dict[int, OverrunNotice | None]:
        keys = [notice_key(r) for r in range(self.world_size)]
        out: dict[int, OverrunNotice | None] = {}
        for rank, raw in enumerate(self.store.multi_get(keys)):
            notice = OverrunNotice.from_json(raw, self.world_size)
            out[rank] = notice if notice is not None and notice.rank == rank else None
        return out

    def read_all(self) -> dict[int, OverrunNotice] | None:
        """Every rank's notice (reads that never wait); None while some rank's key does not exist
        (its watchdog has not started, or has stopped)."""
        keys = [notice_key(r) for r in range(self.world_size)]
        if not self.store.check(keys):
            return None
        return {rank: notice for rank, notice in self._read_notices().items() if notice is not None}


def _log_header(changes: int, posted: int) -> str:
    return f"={changes}:{posted}\n"


def _split_log(raw: bytes) -> tuple[int, int, bytes]:
    """(changes, posted, the bytes after the header); a header that is not what ``_log_header``
    writes counts as none (its bytes count as changes)."""
    if raw.startswith(b"="):
        end = raw.find(b"\n", 0, 40)
        if end > 0:
            head = raw[1:end].split(b":")
            if len(head) == 2 and all(0 < len(h) <= 18 and h.isdigit() for h in head):
                return int(head[0]), int(head[1]), raw[end + 1:]
    return 0, 0, raw


def _as_count(raw: bytes | None) -> int | None:
    """A counter's value as ``add`` writes it (0 when absent); None for anything else."""
    if raw is None:
        return 0
    text = raw.strip()
    if not text or len(text) > 18 or not text.lstrip(b"-").isdigit():
        return None
    return int(text)
