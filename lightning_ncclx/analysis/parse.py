"""Turn one decoded flight-recorder dump (torch format 2.x, pickle or JSON) into a compact
:class:`RankTrace`. Pure; raises DumpReadError for anything that is not a dump."""

from __future__ import annotations

import re
from array import array
from functools import lru_cache
from operator import gt, itemgetter
from dataclasses import replace
from typing import Any

from lightning_ncclx.analysis.columns import (canonical_sig, done_column, open_indices, seq_column, sig_columns,
                                              sig_id, time_column)
from lightning_ncclx.analysis.frames import format_frames, innermost_user_frame
from lightning_ncclx.analysis.model import GroupTrack, OpenOp, P2POp, RankTrace
from lightning_ncclx.errors import DumpReadError

_INT = re.compile(r"-?\d+")
_RANK_LIST = re.compile(r"\[\s*(?:\d+\s*(?:,\s*\d+\s*)*,?\s*)?\]")
_P2P = re.compile(r"^(send|recv)\s+(-?\d+|\?)\s*(->|<-)\s*(-?\d+|\?)")


MAX_RANK = 1 << 20
"""Group members at or beyond this (or negative) make a ``pg_config`` row malformed."""


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """``"[0, 1, 2]"`` (as torch writes it) or a list -> a tuple of ints; None when malformed
    (anything but ints in ``[0, MAX_RANK)``, or more members than that)."""
    if isinstance(value, (list, tuple)) and len(value) <= MAX_RANK and set(map(type, value)) <= {int}:
        return _in_range(tuple(value))
    if isinstance(value, str) and len(value) < 16 * MAX_RANK:
        return _parse_rank_string(value)
    return None


def _in_range(ranks: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if ranks and (min(ranks) < 0 or max(ranks) >= MAX_RANK):
        return None
    return ranks


@lru_cache(maxsize=256)
def _parse_rank_string(value: str) -> tuple[int, ...] | None:
    """Every rank's dump repeats the same strings (16,384 ranks: 16,384 x 16,384 numbers): parse
    and check each once per process, and share the one tuple."""
    if not _RANK_LIST.fullmatch(value.strip()):
        return None
    ranks = tuple(map(int, _INT.findall(value)))
    return _in_range(ranks) if len(ranks) <= MAX_RANK else None


def parse_pg_config(raw: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (desc, ranks), skipping gloo's broken ``""`` key and malformed rows."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    if not isinstance(raw, dict):
        return out
    for key, row in raw.items():
        if not isinstance(row, dict):
            continue
        name, desc = row.get("name", key), row.get("desc", "")
        if not isinstance(name, (str, int)) or not isinstance(desc, (str, int)):
            continue  # a container here would only be expanded by str()
        ranks = parse_ranks(row.get("ranks"))
        if str(name) == "" or ranks is None:
            continue
        out[str(name)[:200]] = (str(desc)[:200], ranks)
    return out


CALLSITE_WINDOW = 128  # newest collectives per group whose user call site is extracted from frames
TRACK_WINDOW = 4096
"""Newest collectives per group and rank that are compacted and compared (at most; see
:func:`track_window`). Every rule compares ranks over the sequence ids they all hold (a ring
buffer of any depth holds only its newest), and the ranks of a hung group are within a few
collectives of each other, so older entries of a deep buffer (the default holds 20,000) add
reading time and nothing to the verdict. Program order looks at the newest 64 calls, call sites
are kept for the newest 128, straggler statistics use at most ``max(128, 2.1M / ranks)``. The
newest unfinished entries are found over the whole dump regardless."""
MIN_TRACK_WINDOW = 512
WINDOW_CELLS = 8_400_000
"""Entries compacted per group over all ranks, as the window shrinks with the job's size: 4,096
per rank up to 2,048 ranks, 2,048 at 4,096 ranks, 512 from 16,384 ranks up."""


def track_window(world_size: int) -> int:
    return max(MIN_TRACK_WINDOW, min(TRACK_WINDOW, WINDOW_CELLS // max(1, world_size)))


def _declared_world(pg_config: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """The job's size as this dump declares it (its default group's members), 0 when unknown."""
    for desc, ranks in pg_config.values():
        if desc == "default_pg" and ranks:
            return len(ranks)
    return 0


def _track(lib: str, name: str, es: list, done: bytes | None = None, window: int | None = None) -> GroupTrack:
    """Compact one group's entries (all C-level columns; see :mod:`columns`)."""
    seqs = seq_column(es)
    if seqs and min(seqs) < 0:
        raise ValueError("negative collective_seq_id")
    if any(map(gt, seqs, seqs[1:])):  # not in sequence order (a reset buffer, a reused group name)
        order = sorted(range(len(es)), key=seqs.__getitem__)
        es = [es[i] for i in order]
        done = None if done is None else bytes(done[i] for i in order)
        seqs = seq_column(es)
    window = TRACK_WINDOW if window is None else window
    if len(es) > window:
        cut = len(es) - window
        while cut < len(es) and seqs[cut] == seqs[cut - 1]:  # never start inside a coalesced slot
            cut += 1
        es, seqs = es[cut:], seqs[cut:]
        done = None if done is None else done[cut:]
    done = done_column(es, lib) if done is None else done
    times = time_column(es)
    k = max(0, len(es) - CALLSITE_WINDOW)
    seen: dict = {}  # one string object per distinct call site: pickles (and lives) once
    calls = [seen.setdefault(c, c) for c in map(innermost_user_frame, map(_frames, es[k:]))]
    if len(set(seqs)) != len(seqs):  # coalesced: several entries share one sequence id
        return _coalesced_track(lib, name, es, seqs, done, times, [None] * k + calls)
    ids, table = sig_columns(es)
    return GroupTrack(lib, name, str(es[0]["process_group"][1])[:200], seqs, ids, table, done, times, tuple(calls))


def _frames(e: dict) -> Any:
    return e.get("frames")


def _coalesced_track(lib: str, name: str, es: list, seqs: array, done: bytes, times: array,
                     calls: list) -> GroupTrack:
    """Merge entries sharing a sequence id into one slot (rare: coalesced ops on NCCL)."""
    out_seqs, out_sigs, out_done, out_times, out_calls = [], [], [], [], []
    for seq, e, d, t, c in zip(seqs, es, done, times, calls):
        sig = canonical_sig(e)
        if out_seqs and out_seqs[-1] == seq:
            out_sigs[-1] = _merge(out_sigs[-1], sig)
            out_done[-1] = out_done[-1] and d
            out_calls[-1] = out_calls[-1] or c
            continue
        for col, v in zip((out_seqs, out_sigs, out_done, out_times, out_calls), (seq, sig, d, t, c)):
            col.append(v)
    table = {sig_id(s): s for s in dict.fromkeys(out_sigs)}
    by_sig = {s: i for i, s in table.items()}
    n_tail = min(len(out_calls), CALLSITE_WINDOW)
    return GroupTrack(lib, name, str(es[0]["process_group"][1]), array("q", out_seqs),
                      array("q", [by_sig[s] for s in out_sigs]), table, bytes(out_done), array("q", out_times),
                      tuple(out_calls[len(out_calls) - n_tail:]))


def _merge(a: tuple, b: tuple) -> tuple:
    op = a[0] if b[0] in (a[0], "coalesced") else (b[0] if a[0] == "coalesced" else f"{a[0]}+{b[0]}")
    return (op, a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def build_trace(dump: Any, rank: int, path: str, lib_hint: str = "") -> RankTrace:
    """Compact one decoded dump. ``rank`` comes from the file name."""
    if not isinstance(dump, dict):
        raise DumpReadError(f"not a flight-recorder dump: top level is {type(dump).__name__}, not dict")
    version = dump.get("version", "")
    if not isinstance(version, str):
        raise DumpReadError(f"not a flight-recorder dump: 'version' is {type(version).__name__}, not a string")
    if not version:
        raise DumpReadError("not a flight-recorder dump: no 'version' key")
    if not version.startswith("2."):
        raise DumpReadError(f"unsupported flight-recorder format version {version!r} (2.x expected)")
    entries = dump.get("entries", [])  # a JSON dump with zero entries has no 'entries' key
    if not isinstance(entries, list):
        raise DumpReadError(f"'entries' is {type(entries).__name__}, not a list")
    names = check_entry_types(entries)
    try:
        return _compact(dump, entries, names, rank, path, version, lib_hint)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        raise DumpReadError(_count_message(entries, f"{type(exc).__name__}: {str(exc)[:100]}")) from None


_SIZE_KEYS = ("input_sizes", "output_sizes")
_DTYPE_KEYS = ("input_dtypes", "output_dtypes")
_CONTAINERS = {list, tuple}


def check_entry_types(entries: list) -> list[str]:
    """The entries are dicts with string ``profiling_name`` s (checked in C); returns the names.
    The other fields are checked where they are first read (``_listed``, ``seq_column``,
    ``_partition``, ``_open_op``) before anything hashes, marshals or formats them: a memo-shared
    pickle can make one field a 2**40-leaf tree, which any of those would walk."""
    if not set(map(type, entries)) <= {dict}:
        raise DumpReadError(_count_message(entries, "entries that are not dicts"))
    try:
        names = list(map(_NAME, entries))
    except KeyError:
        raise DumpReadError(_count_message(entries, "entries without profiling_name")) from None
    if not set(map(type, names)) <= {str}:
        raise DumpReadError(_count_message(entries, "profiling_name of the wrong type"))
    return names


def _count_message(entries: list, fallback: str) -> str:
    """How many entries cannot be trusted, and why for the first (walks every entry: only for a
    dump already known to be bad)."""
    bad = [i for i, e in enumerate(entries) if _entry_problem(e)]
    if not bad:
        return f"malformed entry ({fallback})"
    return (f"malformed entry: {len(bad)} of {len(entries)} entries have a field missing or of the wrong type "
            f"(entry {bad[0]}: {_entry_problem(entries[bad[0]])})")


def _entry_problem(e: Any) -> str | None:
    """Why one entry cannot be trusted, or None."""
    if not isinstance(e, dict):
        return f"entry is {type(e).__name__}, not a dict"
    name, seq, pg = e.get("profiling_name"), e.get("collective_seq_id"), e.get("process_group")
    if not isinstance(name, str):
        return "profiling_name is missing" if name is None else f"profiling_name is {type(name).__name__}"
    if type(seq) is not int or seq < 0:
        return f"collective_seq_id is {seq!r}" if isinstance(seq, (int, str)) and len(str(seq)) < 40 else \
            f"collective_seq_id is {type(seq).__name__}"
    if type(pg) not in _CONTAINERS or len(pg) != 2 or not all(isinstance(x, (str, int)) for x in pg):
        return "process_group is not a (name, desc) pair"
    for key in _SIZE_KEYS + _DTYPE_KEYS:
        v = e.get(key)
        if v and type(v) not in _CONTAINERS:
            return f"{key} is {type(v).__name__}"
        for x in v or ():
            if key in _DTYPE_KEYS and not isinstance(x, str):
                return f"{key} holds {type(x).__name__}"
            if key in _SIZE_KEYS and type(x) is not int and (
                    type(x) not in _CONTAINERS or not all(type(n) is int for n in x)):
                return f"{key} holds {type(x).__name__} or nests too deep"
    for key in ("state", "time_created_ns", "p2p_seq_id"):
        v = e.get(key)
        if v is not None and not isinstance(v, (str, int, float, bool)):
            return f"{key} is {type(v).__name__}"
    return None


def _compact(dump: dict, entries: list, names: list[str], rank: int, path: str, version: str,
             lib_hint: str) -> RankTrace:
    libs = {n.rpartition(":")[0] for n in set(names)}
    lib = _pick_lib(libs, lib_hint)
    by_group, p2p_entries = _partition(entries)
    done_all = done_column(entries, lib)
    pg_config = parse_pg_config(dump.get("pg_config"))
    window = track_window(_declared_world(pg_config))
    if len(by_group) == 1 and not p2p_entries:  # the common case: reuse the whole-dump column
        tracks = {g: _track(lib, g, es, done_all, window) for g, es in by_group.items()}
    else:
        tracks = {g: _track(lib, g, es, window=window) for g, es in by_group.items()}
    p2p = []
    for e in p2p_entries:
        done = bool(e.get("retired")) if lib == "gloo" else (e.get("state") == "completed" or bool(e.get("retired")))
        p2p_seq = e.get("p2p_seq_id", 0)
        if type(p2p_seq) is not int:
            raise ValueError(f"p2p_seq_id is {type(p2p_seq).__name__}")
        op = _p2p(str(e["process_group"][0]), e["profiling_name"].rpartition(":")[2], p2p_seq, done)
        sig = canonical_sig(e)
        p2p.append(replace(op, sizes=sig[1] or sig[3], dtypes=sig[2] or sig[4]))
    open_ops = [_open_op(entries[i], lib) for i in open_indices(done_all)]
    newest = max((t for tr in tracks.values() for t in tr.times_ns[-1:]), default=0)
    newest = max([newest] + [e.get("time_created_ns") or 0 for e in p2p_entries])
    comm = dump.get("comm_lib_version")
    return RankTrace(rank, lib, path, version, pg_config, tracks, tuple(p2p),
                     tuple(open_ops), len(entries), newest,
                     comm_lib_version=comm[:100] if isinstance(comm, str) else "")


_NAME = itemgetter("profiling_name")
_PG = itemgetter("process_group")
_IS_P2P = itemgetter("is_p2p")
_SEQ = itemgetter("collective_seq_id")


def _is_p2p(e: dict) -> bool:
    return bool(e.get("is_p2p")) or (e["collective_seq_id"] == 0 and e.get("p2p_seq_id", 0) > 0)


def _partition(entries: list) -> tuple[dict[str, list], list]:
    """Collectives by process group name, and point-to-point entries. One group and no p2p (the
    common case) is detected in C; anything else walks the entries."""
    if not entries:
        return {}, []
    try:
        pgs = list(map(_PG, entries))
        simple = (not any(map(_IS_P2P, entries)) and 0 not in map(_SEQ, entries)
                  and pgs.count(pgs[0]) == len(pgs))
    except KeyError:
        simple = False
    if simple:  # every entry's pair equals the first: checking the first checks them all
        return {_group_name(pgs[0]): entries}, []
    by_group: dict[str, list] = {}
    p2p_entries = []
    for e in entries:
        if _is_p2p(e):
            _group_name(e["process_group"])
            p2p_entries.append(e)
        else:
            by_group.setdefault(_group_name(e["process_group"]), []).append(e)
    return by_group, p2p_entries


def _group_name(pg: Any) -> str:
    """The name of a ``process_group`` (name, desc) pair; ValueError for anything else."""
    if type(pg) not in _CONTAINERS or len(pg) != 2 or not all(type(x) in (str, int) for x in pg):
        raise ValueError("process_group is not a (name, desc) pair")
    return str(pg[0])


def _open_op(e: dict, lib: str) -> OpenOp:
    """An entry that has not finished (see :func:`columns.done_column`) as the op a rank is in."""
    seq = e["collective_seq_id"]
    is_p2p = _is_p2p(e)
    pg = e["process_group"]
    if not isinstance(e.get("state", ""), (str, type(None))):
        raise ValueError(f"state is {type(e.get('state')).__name__}")
    return OpenOp(lib, str(pg[0]), str(pg[1]), e.get("p2p_seq_id", 0) if is_p2p else seq,
                  e["profiling_name"].rpartition(":")[2], is_p2p, e.get("state", ""),
                  e.get("time_created_ns") or 0, format_frames(e.get("frames")))


def _pick_lib(libs: set[str], hint: str) -> str:
    if len(libs) == 1:
        return next(iter(libs))
    if hint:
        return hint
    return "+".join(sorted(libs)) if libs else "unknown"


def _p2p(group: str, name: str, seq: int, done: bool) -> P2POp:
    match = _P2P.match(name)
    if not match:
        return P2POp(group, name.split(" ")[0], -1, -1, seq, done)
    op, a, arrow, b = match.groups()
    a_i = int(a) if a != "?" else -1
    b_i = int(b) if b != "?" else -1
    src, dst = (a_i, b_i) if arrow == "->" else (b_i, a_i)
    return P2POp(group, op, src, dst, seq, done)
