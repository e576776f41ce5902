"""Process-group membership as a dump declares it (``pg_config``): rank lists parsed, checked and
shared, with bounds on how much one dump may declare.

Every rank's dump repeats every group's member list (16,384 ranks: 16,384 copies of a 16,384-number
string), so each distinct string is parsed once per process and every dump gets the same tuple
back. Finding it again costs a comparison of the string, not a hash of it (:class:`_SeenLists`).
"""

from __future__ import annotations

import hashlib
import re
from array import array
from dataclasses import replace
from typing import Any, Sequence

from lightning_ncclx.analysis.model import RankTrace, Unreadable

_INT = re.compile(r"-?\d+")
_RANK_LIST = re.compile(r"\[\s*(?:\d+\s*(?:,\s*\d+\s*)*,?\s*)?\]")

MAX_RANK = 1 << 20
"""Group members at or beyond this (or negative) make a ``pg_config`` row malformed."""
MAX_GROUP_ROWS = 4096
"""``pg_config`` rows read from one dump; the rest are skipped (a job's rank belongs to dozens)."""
MAX_DECLARED_MEMBERS = 4 * MAX_RANK
"""Members over all ``pg_config`` rows of one dump; rows past this many are skipped."""

PgConfig = dict[str, tuple[str, tuple[int, ...]]]


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """``"[0, 1, 2]"`` (as torch writes it) or a list -> a tuple of ints; None when malformed
    (anything but ints in ``[0, MAX_RANK)``, or more members than that)."""
    if isinstance(value, (list, tuple)) and len(value) <= MAX_RANK and set(map(type, value)) <= {int}:
        return _in_range(tuple(value))
    if isinstance(value, str) and len(value) < 16 * MAX_RANK:
        return _SEEN.parsed(value)
    return None


def _in_range(ranks: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if ranks and (min(ranks) < 0 or max(ranks) >= MAX_RANK):
        return None
    return ranks


def _parse_rank_string(value: str) -> tuple[int, ...] | None:
    if not _RANK_LIST.fullmatch(value.strip()):
        return None
    ranks = tuple(map(int, _INT.findall(value)))
    return _in_range(ranks) if len(ranks) <= MAX_RANK else None


class _SeenLists:
    """Member strings parsed so far in this process, found again by length and ends, then
    confirmed by ``==`` (a memory compare: hashing a new 100 KB string object would read it
    slower). Bounded: forgets everything past ``max_members`` members or ``max_lists`` strings."""

    def __init__(self, max_members: int = MAX_DECLARED_MEMBERS, max_lists: int = 256) -> None:
        self._by_shape: dict[tuple[int, str, str], list[tuple[str, tuple[int, ...] | None]]] = {}
        self._members = 0
        self._lists = 0
        self._max_members, self._max_lists = max_members, max_lists

    def parsed(self, value: str) -> tuple[int, ...] | None:
        shape = (len(value), value[:32], value[-32:])
        for text, ranks in self._by_shape.get(shape, ()):
            if text == value:
                return ranks
        ranks = _parse_rank_string(value)
        size = len(ranks) if ranks else 0
        if self._members + size > self._max_members or self._lists >= self._max_lists:
            self._by_shape.clear()
            self._members = self._lists = 0
        self._by_shape.setdefault(shape, []).append((value, ranks))
        self._members += size
        self._lists += 1
        return ranks


_SEEN = _SeenLists()


def parse_pg_config(raw: Any, cut: list[str] | None = None) -> PgConfig:
    """name -> (desc, ranks), skipping gloo's broken ``""`` key and malformed rows. Past
    :data:`MAX_GROUP_ROWS` rows or :data:`MAX_DECLARED_MEMBERS` members the rest is skipped, and
    one line saying so is appended to ``cut``."""
    out: PgConfig = {}
    if not isinstance(raw, dict):
        return out
    members = 0
    for index, (key, row) in enumerate(raw.items()):
        if index >= MAX_GROUP_ROWS:
            _cut(cut, len(raw), index)
            break
        if not isinstance(row, dict):
            continue
        name, desc = row.get("name", key), row.get("desc", "")
        if not isinstance(name, (str, int)) or not isinstance(desc, (str, int)):
            continue  # a container here would only be expanded by str()
        ranks = parse_ranks(row.get("ranks"))
        if str(name) == "" or ranks is None:
            continue
        members += len(ranks)
        if members > MAX_DECLARED_MEMBERS:
            _cut(cut, len(raw), index)
            break
        out[str(name)[:200]] = (str(desc)[:200], ranks)
    return out


def _cut(cut: list[str] | None, rows: int, read: int) -> None:
    if cut is not None:
        cut.append(f"its pg_config declares {rows} process groups; only the first {read} were read (at most "
                   f"{MAX_GROUP_ROWS} groups and {MAX_DECLARED_MEMBERS:,} members per dump)")


def declared_world(pg_config: PgConfig) -> int:
    """The job's size as a dump declares it (its default group's members), 0 when unknown."""
    for desc, ranks in pg_config.values():
        if desc == "default_pg" and ranks:
            return len(ranks)
    return 0


class MembershipsSent:
    """A reading worker's side of sharing memberships with the parent: each distinct member tuple
    goes back as ``array('q')`` the first time, as a 16-byte digest after that (pool.map yields
    in order, so the parent has read a worker's first copy before any later reference to it).
    The parsed tuples are shared objects (see :class:`_SeenLists`), so a tuple seen before is
    known by identity: no array, no hash."""

    def __init__(self) -> None:
        self._sent: set[bytes] = set()
        self._by_id: dict[int, tuple[tuple[int, ...], bytes]] = {}  # the tuple is kept: its id stays its own

    def packed(self, trace: RankTrace | Unreadable) -> RankTrace | Unreadable:
        if not isinstance(trace, RankTrace) or not trace.pg_config:
            return trace
        out = {}
        for name, (desc, ranks) in trace.pg_config.items():
            known = self._by_id.get(id(ranks))
            if known is not None and known[0] is ranks:
                out[name] = (desc, known[1])
                continue
            packed = array("q", ranks)
            key = _digest(packed)
            out[name] = (desc, key if key in self._sent else packed)
            self._sent.add(key)
            if len(self._by_id) > 4096:
                self._by_id.clear()
            self._by_id[id(ranks)] = (ranks, key)
        return replace(trace, pg_config=out)


class SharedMemberships:
    """The parent's side: one tuple object per distinct membership. Every rank's dump repeats
    every group's ranks (16,384 ranks: 16,384 copies of a 16,384-number list); shared, they are
    stored, hashed and compared once."""

    def __init__(self) -> None:
        self._by_digest: dict[bytes, tuple[int, ...]] = {}

    def _shared(self, ranks: Sequence[int] | array | bytes) -> tuple[int, ...]:
        if isinstance(ranks, bytes):  # a digest: the same worker sent the membership before
            return self._by_digest[ranks]
        packed = ranks if isinstance(ranks, array) else array("q", ranks)
        key = _digest(packed)
        found = self._by_digest.get(key)
        if found is None:
            found = self._by_digest[key] = tuple(packed)
        return found

    def trace(self, trace: RankTrace | Unreadable) -> RankTrace | Unreadable:
        if not isinstance(trace, RankTrace) or not trace.pg_config:
            return trace
        return replace(trace, pg_config={name: (desc, self._shared(ranks)) for name, (desc, ranks) in
                                         trace.pg_config.items()})


def _digest(packed: array) -> bytes:
    return hashlib.blake2b(packed.tobytes(), digest_size=16).digest()
