"""The common dump, compacted in a few C-level passes: every entry a collective of one process
group, sequence ids consecutive. That is a data-parallel job's dump, and at 16,384 ranks reading
it is most of the analyzer's time, so every field of every entry is looked up at most once.

:func:`compact_common` answers None for anything else (several groups, point-to-point, coalesced
or reordered sequence ids, a field missing or of another type): :mod:`parse` then reads the dump
entry by entry, with the same result where both apply, and says what is wrong where it is
malformed. Also the small helpers both paths share.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from operator import countOf, itemgetter, truth
from typing import Any, Mapping

from lightning_ncclx.analysis.columns import (NAME_CHARS, SIG_FIELDS, done_column, open_indices, sig_columns,
                                              time_column)
from lightning_ncclx.analysis.frames import format_frames, innermost_user_frame
from lightning_ncclx.analysis.model import GroupTrack, OpenOp, P2POp

CALLSITE_WINDOW = 128  # newest collectives per group whose user call site is extracted from frames
MAX_OPEN = 1024
"""Unfinished operations kept per dump, oldest first (a rank has one or a few in flight)."""
_CONTAINERS = {list, tuple}
_COMMON = ("profiling_name", "process_group", "collective_seq_id", "is_p2p", "retired")
"""The fields read from every entry, one pass each; the others only from the window's."""
_FEW_PENDING = 64  # unretired entries looked at one by one; more: the whole-column path


@dataclass(frozen=True)
class Compacted:
    """One dump's content as :class:`~lightning_ncclx.analysis.model.RankTrace` holds it."""

    lib: str
    groups: Mapping[str, GroupTrack]
    p2p: tuple[P2POp, ...]
    open_ops: tuple[OpenOp, ...]
    newest_ns: int


def compact_common(entries: list, lib_hint: str, window: int, cut: list[str]) -> Compacted | None:
    """The common dump (see the module), or None. ``window``: newest collectives compacted."""
    if not entries or type(entries[0]) is not dict:
        return None
    try:
        keys = own_keys(entries[0])
        get_name, get_pg, get_seq, get_p2p, get_retired = (own_getter(keys, (f,)) for f in _COMMON)
        pg = get_pg(entries[0])
        name, desc = group_name(pg), str(pg[1])[:NAME_CHARS]  # checked first: a memo-shared tree is never compared
        names = _names(list(map(get_name, entries)))
        if any(map(get_p2p, entries)) or countOf(map(get_pg, entries), pg) != len(entries):
            return None
        seqs = list(map(get_seq, entries))
        if not _consecutive(seqs):
            return None  # a 0 may be point-to-point; gaps, repeats and disorder take the general path
        lib = pick_lib({n.rpartition(":")[0] for n in names}, lib_hint)
        done = _done(entries, _flags(entries, get_retired), lib)
        start = max(0, len(entries) - window)
        es = entries[start:]
        ids, table = sig_columns(es, own_getter(keys, SIG_FIELDS))
        times = time_column(es, own_getter(keys, ("time_created_ns",)))
        track = GroupTrack(lib, name, desc, array("q", seqs[start:]), ids, table, done[start:], times,
                           callsite_tail(es))
        open_ops = bounded_open(entries, open_indices(done), lib, cut)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError):
        return None
    return Compacted(lib, {name: track}, (), open_ops, times[-1] if times else 0)


def own_keys(first: dict) -> dict[str, str]:
    """The string keys of an entry, each mapped to itself (see :func:`own_getter`)."""
    return {k: k for k in first if type(k) is str}


def own_getter(own: dict[str, str], fields: tuple[str, ...]) -> itemgetter:
    """``itemgetter(*fields)`` keyed by the dump's own key objects (``own``: :func:`own_keys` of
    its first entry): an unpickled dump holds one string per key, shared by all its entries, and a
    lookup by that very object skips comparing the strings. A pass per field over the entries
    costs less than one pass that builds a tuple per entry and transposes them (hardware prefetch
    follows the entries in order; ``zip(*rows)`` hops between 2,000 iterators)."""
    return itemgetter(*(own.get(f, f) for f in fields))


def _names(names: list) -> set[str]:
    """The distinct names; TypeError unless every one is a string. ``str.join`` checks the types
    in C before anything is hashed (a tuple built from shared parts would hash for ever)."""
    "".join(names)
    return set(names)


def _consecutive(seqs: list) -> bool:
    """Positive ints (not bools or floats: those take the general path), each one more than the
    one before. A list equal to a ``range`` holds ints, bools or floats (nothing else a dump can
    hold equals an int); a bool could only equal the first id, which must be an ``int``, and a
    float among them makes their sum a float: no type is asked per id."""
    first = seqs[0]
    return (type(first) is int and first > 0 and seqs == list(range(first, first + len(seqs)))
            and type(sum(seqs)) is int)


def _flags(entries: list, get: itemgetter) -> bytes:
    """1 where the field is true: bools (what dumps hold) go into ``bytes`` as they are; anything
    else (None, a number past 1, a string) is taken as its truth. The common dump (every entry
    ``True``, or all but its newest) is recognised by counting ``True`` s, which needs no
    conversion per entry."""
    n = len(entries)
    finished = countOf(map(get, entries), True)
    if finished == n:
        return b"\x01" * n
    if finished == n - 1:
        newest = get(entries[-1])
        if not (newest is True or newest == True):  # noqa: E712 - what countOf compared with
            return b"\x01" * (n - 1) + (b"\x01" if newest else b"\x00")
    try:
        raw = bytes(map(get, entries))
    except (TypeError, ValueError):
        return bytes(map(truth, map(get, entries)))
    return raw if not raw.strip(b"\x00\x01") else bytes(map(truth, raw))


def _done(entries: list, retired: bytes, lib: str) -> bytes:
    """:func:`columns.done_column` from the ``retired`` flags already read: gloo's progress is
    ``retired`` alone; elsewhere the few unretired entries are finished when ``completed``."""
    pending = retired.count(0)
    if lib == "gloo" or not pending:
        return retired
    if pending > _FEW_PENDING:
        return done_column(entries, lib)
    done = bytearray(retired)
    for i in open_indices(retired):
        done[i] = entries[i].get("state") == "completed"
    return bytes(done)


def callsite_tail(es: list) -> tuple[str | None, ...]:
    """The user call site of each of the newest :data:`CALLSITE_WINDOW` entries, one string
    object per distinct site (it pickles, and lives, once). A frames list that several entries
    share (a memo-shared pickle) is read once."""
    seen: dict = {}
    by_frames: dict[int, str | None] = {}
    out = []
    for e in es[-CALLSITE_WINDOW:]:
        frames = e.get("frames")
        site = by_frames.get(id(frames), _UNSEEN)
        if site is _UNSEEN:
            site = by_frames[id(frames)] = innermost_user_frame(frames)
        out.append(seen.setdefault(site, site))
    return tuple(out)


_UNSEEN = object()


def bounded_open(entries: list, indices: list[int], lib: str, cut: list[str]) -> tuple[OpenOp, ...]:
    """The unfinished entries at ``indices`` as ops, the oldest :data:`MAX_OPEN` of them."""
    if len(indices) > MAX_OPEN:
        cut.append(f"{len(indices):,} operations are unfinished in it; the oldest {MAX_OPEN} were read")
    return tuple(open_op(entries[i], lib) for i in indices[:MAX_OPEN])


def is_p2p(e: dict) -> bool:
    return bool(e.get("is_p2p")) or (e["collective_seq_id"] == 0 and e.get("p2p_seq_id", 0) > 0)


def group_name(pg: Any) -> str:
    """The name of a ``process_group`` (name, desc) pair; ValueError for anything else."""
    if type(pg) not in _CONTAINERS or len(pg) != 2 or not all(type(x) in (str, int) for x in pg):
        raise ValueError("process_group is not a (name, desc) pair")
    return str(pg[0])[:NAME_CHARS]


def open_op(e: dict, lib: str) -> OpenOp:
    """An entry that has not finished (see :func:`columns.done_column`) as the op a rank is in."""
    seq = e["collective_seq_id"]
    p2p = is_p2p(e)
    pg = e["process_group"]
    if not isinstance(e.get("state", ""), (str, type(None))):
        raise ValueError(f"state is {type(e.get('state')).__name__}")
    state = e.get("state", "")
    return OpenOp(lib, group_name(pg), str(pg[1])[:NAME_CHARS], e.get("p2p_seq_id", 0) if p2p else seq,
                  e["profiling_name"].rpartition(":")[2][:NAME_CHARS], p2p, state[:NAME_CHARS] if state else state,
                  e.get("time_created_ns") or 0, format_frames(e.get("frames")))


def pick_lib(libs: set[str], hint: str) -> str:
    libs = {lib[:NAME_CHARS] for lib in libs}
    if len(libs) == 1:
        return next(iter(libs))
    if hint:
        return hint
    return "+".join(sorted(libs)) if libs else "unknown"
