"""Turn one decoded flight-recorder dump (torch format 2.x, pickle or JSON) into a compact
:class:`RankTrace`. Pure; raises DumpReadError for anything that is not a dump.

The common dump (one process group, consecutive sequence ids) is compacted by
:func:`compact.compact_common` in a few C-level passes; everything else here, entry by entry.
What a dump holds beyond the bounds (:data:`MAX_ENTRIES` entries, :data:`MAX_GROUPS` groups,
``compact.MAX_OPEN`` unfinished ops, ``members.MAX_GROUP_ROWS`` declared groups) is not read, and
``RankTrace.cut`` says what was left out.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import replace
from operator import gt, itemgetter
from typing import Any

from lightning_ncclx.analysis.columns import (canonical_sig, done_column, open_indices, seq_column, sig_columns,
                                              sig_id, time_column)
from lightning_ncclx.analysis.compact import (CALLSITE_WINDOW, MAX_OPEN, NAME_CHARS, Compacted, bounded_open,
                                              callsite_tail, compact_common, group_name, is_p2p, pick_lib)
from lightning_ncclx.analysis.members import MAX_RANK, declared_world, parse_pg_config, parse_ranks
from lightning_ncclx.analysis.model import GroupTrack, P2POp, RankTrace
from lightning_ncclx.errors import DumpReadError

__all__ = ["MAX_RANK", "build_trace", "check_entry_types", "parse_pg_config", "parse_ranks", "track_window"]

_P2P = re.compile(r"^(send|recv)\s+(-?\d+|\?)\s*(->|<-)\s*(-?\d+|\?)")

MAX_ENTRIES = 1 << 16
"""Entries read from one dump: the newest this many (torch's default buffer holds 2,000, a deep
one 20,000). Older ones are not read, and the summary's notes say so."""
MAX_GROUPS = 1024
"""Process groups with collectives in one dump (a rank uses dozens): past this many, those whose
newest entry is oldest are not read."""
TRACK_WINDOW = 4096
"""Newest collectives per group and rank that are compacted and compared (at most; see
:func:`track_window`). Every rule compares ranks over the sequence ids they all hold (a ring
buffer of any depth holds only its newest), and the ranks of a hung group are within a few
collectives of each other, so older entries of a deep buffer (the default holds 20,000) add
reading time and nothing to the verdict. Program order looks at the newest 64 calls, call sites
are kept for the newest 128, straggler statistics use at most ``max(128, 2.1M / ranks)``. The
newest unfinished entries are found over the whole dump regardless."""
MIN_TRACK_WINDOW = 256
WINDOW_CELLS = 4_200_000
"""Entries compacted per group over all ranks, as the window shrinks with the job's size: 4,096
per rank up to 1,024 ranks, 1,025 at 4,096 ranks, 256 from 16,384 ranks up (still twice the
newest 128 that call sites and, at that size, straggler statistics use). At 16,384 ranks the
window's signatures are a third of the reading beyond unpickling: 512 there cost 134 µs more per
dump (unpickling one takes ~2.1 ms) and 146 MiB more of the parent's memory."""


def track_window(world_size: int) -> int:
    return max(MIN_TRACK_WINDOW, min(TRACK_WINDOW, WINDOW_CELLS // max(1, world_size)))


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
    calls = list(callsite_tail(es))
    desc = str(es[0]["process_group"][1])[:NAME_CHARS]
    if len(set(seqs)) != len(seqs):  # coalesced: several entries share one sequence id
        return _coalesced_track(lib, name, desc, es, seqs, done, times, [None] * (len(es) - len(calls)) + calls)
    ids, table = sig_columns(es)
    return GroupTrack(lib, name, desc, seqs, ids, table, done, times, tuple(calls))


def _coalesced_track(lib: str, name: str, desc: str, es: list, seqs: array, done: bytes, times: array,
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
    return GroupTrack(lib, name, desc, array("q", out_seqs),
                      array("q", [by_sig[s] for s in out_sigs]), table, bytes(out_done), array("q", out_times),
                      tuple(out_calls[len(out_calls) - n_tail:]))


def _merge(a: tuple, b: tuple) -> tuple:
    op = a[0] if b[0] in (a[0], "coalesced") else (b[0] if a[0] == "coalesced" else f"{a[0]}+{b[0]}")
    return (op, a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def build_trace(dump: Any, rank: int, path: str, lib_hint: str = "", entries_total: int | None = None) -> RankTrace:
    """Compact one decoded dump. ``rank`` comes from the file name; ``entries_total``: how many
    entries the file held when its reader kept only the newest (see :mod:`json_stream`)."""
    if not isinstance(dump, dict):
        raise DumpReadError(f"not a flight-recorder dump: top level is {type(dump).__name__}, not dict")
    version = dump.get("version", "")
    if not isinstance(version, str):
        raise DumpReadError(f"not a flight-recorder dump: 'version' is {type(version).__name__}, not a string")
    if not version:
        raise DumpReadError("not a flight-recorder dump: no 'version' key")
    if not version.startswith("2."):
        raise DumpReadError(f"unsupported flight-recorder format version {version[:40]!r} (2.x expected)")
    entries = dump.get("entries", [])  # a JSON dump with zero entries has no 'entries' key
    if not isinstance(entries, list):
        raise DumpReadError(f"'entries' is {type(entries).__name__}, not a list")
    cut: list[str] = []
    total = max(len(entries), entries_total or 0)
    if len(entries) > MAX_ENTRIES:
        entries = entries[-MAX_ENTRIES:]
    if total > len(entries):
        cut.append(f"it holds {total:,} entries; the newest {len(entries):,} were read")
    pg_config = parse_pg_config(dump.get("pg_config"), cut)
    window = track_window(declared_world(pg_config))
    content = compact_common(entries, lib_hint, window, cut)
    if content is None:
        names = check_entry_types(entries)
        try:
            content = _compact(entries, names, lib_hint, window, cut)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
            raise DumpReadError(_count_message(entries, f"{type(exc).__name__}: {str(exc)[:100]}")) from None
    comm = dump.get("comm_lib_version")
    return RankTrace(rank, content.lib, path, version, pg_config, content.groups, content.p2p, content.open_ops,
                     total, content.newest_ns, comm_lib_version=comm[:100] if isinstance(comm, str) else "",
                     cut=tuple(cut), pg_status=parse_pg_status(dump.get("pg_status")))


MAX_STATUS_GROUPS = 4096


def parse_pg_status(status: Any) -> dict[str, tuple[int, int]]:
    """``pg_status`` as group name -> (last enqueued, last completed); ints in pickles, strings in
    JSON. Anything else, or more groups than a job has, reads as unknown (left out)."""
    if type(status) is not dict or len(status) > MAX_STATUS_GROUPS:
        return {}
    out = {}
    for name, counters in status.items():
        if type(name) is not str or type(counters) is not dict:
            continue
        enqueued = _counter(counters.get("last_enqueued_collective"))
        completed = _counter(counters.get("last_completed_collective"))
        if enqueued is not None and completed is not None:
            out[name[:NAME_CHARS]] = (enqueued, completed)
    return out


def _counter(value: Any) -> int | None:
    if type(value) is str and 0 < len(value) <= 20:
        try:
            value = int(value)
        except ValueError:
            return None
    return value if type(value) is int and -1 <= value < 1 << 62 else None


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


def _compact(entries: list, names: list[str], lib_hint: str, window: int, cut: list[str]) -> Compacted:
    """Any dump, entry by entry: several groups, point-to-point, coalesced or reordered ids."""
    lib = pick_lib({n.rpartition(":")[0] for n in set(names)}, lib_hint)
    by_group, p2p_entries = _partition(entries)
    if len(by_group) > MAX_GROUPS:
        by_group = _newest_groups(entries, by_group, cut)
    done_all = done_column(entries, lib)
    if len(by_group) == 1 and not p2p_entries:  # one group: reuse the whole-dump column
        tracks = {g: _track(lib, g, es, done_all, window) for g, es in by_group.items()}
    else:
        tracks = {g: _track(lib, g, es, window=window) for g, es in by_group.items()}
    p2p = []
    for e in p2p_entries:
        done = bool(e.get("retired")) if lib == "gloo" else (e.get("state") == "completed" or bool(e.get("retired")))
        p2p_seq = e.get("p2p_seq_id", 0)
        if type(p2p_seq) is not int:
            raise ValueError(f"p2p_seq_id is {type(p2p_seq).__name__}")
        op = _p2p(group_name(e["process_group"]), e["profiling_name"].rpartition(":")[2], p2p_seq, done)
        sig = canonical_sig(e)
        p2p.append(replace(op, sizes=sig[1] or sig[3], dtypes=sig[2] or sig[4]))
    open_ops = bounded_open(entries, open_indices(done_all), lib, cut)
    newest = max((t for tr in tracks.values() for t in tr.times_ns[-1:]), default=0)
    newest = max([newest] + [e.get("time_created_ns") or 0 for e in p2p_entries])
    return Compacted(lib, tracks, _bounded_p2p(p2p, cut), open_ops, newest)


def _newest_groups(entries: list, by_group: dict[str, list], cut: list[str]) -> dict[str, list]:
    """The :data:`MAX_GROUPS` groups whose newest entry is newest (a hostile dump names a group
    per entry; a job's rank uses dozens)."""
    last: dict[str, int] = {}
    for i, e in enumerate(entries):
        last[group_name(e["process_group"])] = i
    keep = sorted(by_group, key=lambda g: last.get(g, -1))[-MAX_GROUPS:]
    cut.append(f"it has collectives in {len(by_group):,} process groups; the {MAX_GROUPS} with the newest were read")
    return {g: by_group[g] for g in by_group if g in set(keep)}


def _bounded_p2p(ops: list[P2POp], cut: list[str]) -> tuple[P2POp, ...]:
    """Every unfinished send/recv (the oldest ``compact.MAX_OPEN``), and of the finished ones only
    each group's newest: a finished pair is never a finding, it only shows the group is used."""
    pending = [i for i, op in enumerate(ops) if not op.done]
    if len(pending) > MAX_OPEN:
        cut.append(f"{len(pending):,} sends and receives are unfinished in it; the oldest {MAX_OPEN} were read")
    newest_done = {op.group: i for i, op in enumerate(ops) if op.done}
    keep = set(pending[:MAX_OPEN]) | set(newest_done.values())
    return tuple(op for i, op in enumerate(ops) if i in keep)


_NAME = itemgetter("profiling_name")
_PG = itemgetter("process_group")
_IS_P2P = itemgetter("is_p2p")
_SEQ = itemgetter("collective_seq_id")


def _partition(entries: list) -> tuple[dict[str, list], list]:
    """Collectives by process group name, and point-to-point entries. One group and no p2p (the
    common case) is detected in C; anything else walks the entries."""
    if not entries:
        return {}, []
    try:
        pgs = list(map(_PG, entries))
        group_name(pgs[0])  # a valid pair first: a count against a memo-shared tree would walk it
        simple = (not any(map(_IS_P2P, entries)) and 0 not in map(_SEQ, entries)
                  and pgs.count(pgs[0]) == len(pgs))
    except (KeyError, ValueError):
        simple = False
    if simple:  # every entry's pair equals the first: checking the first checks them all
        return {group_name(pgs[0]): entries}, []
    by_group: dict[str, list] = {}
    p2p_entries = []
    for e in entries:
        if is_p2p(e):
            group_name(e["process_group"])
            p2p_entries.append(e)
        else:
            by_group.setdefault(group_name(e["process_group"]), []).append(e)
    return by_group, p2p_entries


def _p2p(group: str, name: str, seq: int, done: bool) -> P2POp:
    name = name[:NAME_CHARS]
    match = _P2P.match(name)
    if not match:
        return P2POp(group, name.split(" ")[0], -1, -1, seq, done)
    op, a, arrow, b = match.groups()
    a_i = int(a) if a != "?" else -1
    b_i = int(b) if b != "?" else -1
    src, dst = (a_i, b_i) if arrow == "->" else (b_i, a_i)
    return P2POp(group, op, src, dst, seq, done)
