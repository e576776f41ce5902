"""Turn one decoded flight-recorder dump (torch format 2.x, pickle or JSON) into a compact
:class:`RankTrace`. Pure; raises DumpReadError for anything that is not a dump."""

from __future__ import annotations

import re
from typing import Any

from lightning_ncclx.analysis.frames import format_frames, innermost_user_frame
from lightning_ncclx.analysis.model import GroupTrack, OpenOp, P2POp, RankTrace
from lightning_ncclx.errors import DumpReadError

_INT = re.compile(r"-?\d+")
_P2P = re.compile(r"^(send|recv)\s+(-?\d+|\?)\s*(->|<-)\s*(-?\d+|\?)")


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """``"[0, 1, 2]"`` (as torch writes it) or a list -> a tuple of ints; None when malformed."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    if isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]"):
        return tuple(int(v) for v in _INT.findall(value))
    return None


def parse_pg_config(raw: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (desc, ranks), skipping gloo's broken ``""`` key and malformed rows."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    if not isinstance(raw, dict):
        return out
    for key, row in raw.items():
        if not isinstance(row, dict):
            continue
        name = str(row.get("name", key))
        ranks = parse_ranks(row.get("ranks"))
        if name == "" or ranks is None:
            continue
        out[name] = (str(row.get("desc", "")), ranks)
    return out


CALLSITE_WINDOW = 128  # newest collectives per group whose user call site is extracted from frames


def _merge(a: tuple, b: tuple) -> tuple:
    op = a[0] if b[0] in (a[0], "coalesced") else (b[0] if a[0] == "coalesced" else f"{a[0]}+{b[0]}")
    return (op, list(a[1]) + list(b[1]), list(a[2]) + list(b[2]), list(a[3]) + list(b[3]), list(a[4]) + list(b[4]))


def _track(lib: str, name: str, es: list) -> GroupTrack:
    """Column-wise extraction (list comprehensions: the hot loop of the whole analyzer)."""
    ops = {n: n.rpartition(":")[2] for n in {e["profiling_name"] for e in es}}
    seqs = [e["collective_seq_id"] for e in es]
    sigs = list(zip([ops[e["profiling_name"]] for e in es], [e.get("input_sizes") or [] for e in es],
                    [e.get("input_dtypes") or [] for e in es], [e.get("output_sizes") or [] for e in es],
                    [e.get("output_dtypes") or [] for e in es]))
    states = [e.get("state", "") for e in es]
    if lib == "gloo":  # gloo never leaves "scheduled": retired is the only progress signal
        done = [bool(e.get("retired")) for e in es]
    else:
        done = [s == "completed" or bool(e.get("retired")) for s, e in zip(states, es)]
    times = [e.get("time_created_ns") or 0 for e in es]
    k = max(0, len(es) - CALLSITE_WINDOW)
    calls = [None] * k + [innermost_user_frame(e.get("frames")) for e in es[k:]]
    if len(set(seqs)) != len(seqs):  # coalesced: several entries share one sequence id
        seqs, sigs, done, times, calls, states = _merge_coalesced(seqs, sigs, done, times, calls, states)
    return GroupTrack(lib, name, str(es[0]["process_group"][1]), tuple(seqs), tuple(sigs), tuple(done),
                      tuple(times), tuple(calls), tuple(states))


def _merge_coalesced(*cols: list) -> tuple[list, ...]:
    out: tuple[list, ...] = tuple([] for _ in cols)
    seqs, sigs, done, times, calls, states = out
    for seq, sig, d, t, c, st in zip(*cols):
        if seqs and seqs[-1] == seq:
            sigs[-1] = _merge(sigs[-1], sig)
            done[-1] = done[-1] and d
            calls[-1] = calls[-1] or c
            continue
        for col, v in zip(out, (seq, sig, d, t, c, st)):
            col.append(v)
    return out


def build_trace(dump: Any, rank: int, path: str, lib_hint: str = "") -> RankTrace:
    """Compact one decoded dump. ``rank`` comes from the file name."""
    if not isinstance(dump, dict):
        raise DumpReadError(f"not a flight-recorder dump: top level is {type(dump).__name__}, not dict")
    version = str(dump.get("version", ""))
    if not version:
        raise DumpReadError("not a flight-recorder dump: no 'version' key")
    if not version.startswith("2."):
        raise DumpReadError(f"unsupported flight-recorder format version {version!r} (2.x expected)")
    entries = dump.get("entries", [])  # a JSON dump with zero entries has no 'entries' key
    if not isinstance(entries, list):
        raise DumpReadError(f"'entries' is {type(entries).__name__}, not a list")
    try:
        return _compact(dump, entries, rank, path, version, lib_hint)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise DumpReadError(f"malformed entry ({type(exc).__name__}: {exc})") from None


def _compact(dump: dict, entries: list, rank: int, path: str, version: str, lib_hint: str) -> RankTrace:
    by_group: dict[str, list] = {}
    p2p_entries = []
    for e in entries:
        if e.get("is_p2p") or (e["collective_seq_id"] == 0 and e.get("p2p_seq_id", 0) > 0):
            p2p_entries.append(e)
        else:
            by_group.setdefault(str(e["process_group"][0]), []).append(e)
    libs = {n.rpartition(":")[0] for n in {e["profiling_name"] for e in entries}}
    lib = _pick_lib(libs, lib_hint)
    tracks = {g: _track(lib, g, es) for g, es in by_group.items()}
    p2p = []
    open_ops: list[OpenOp] = []
    for e in p2p_entries:
        done = bool(e.get("retired")) if lib == "gloo" else (e.get("state") == "completed" or bool(e.get("retired")))
        p2p.append(_p2p(str(e["process_group"][0]), e["profiling_name"].rpartition(":")[2], e.get("p2p_seq_id", 0), done))
    for e in entries:
        _maybe_open(e, lib, open_ops)
    newest = max((t for tr in tracks.values() for t in tr.times_ns[-1:]), default=0)
    newest = max([newest] + [e.get("time_created_ns") or 0 for e in p2p_entries])
    return RankTrace(rank, lib, path, version, parse_pg_config(dump.get("pg_config")), tracks, tuple(p2p),
                     tuple(open_ops), len(entries), newest)


def _maybe_open(e: dict, lib: str, out: list) -> None:
    if lib == "gloo":
        if e.get("retired"):
            return
    elif e.get("state") == "completed" or e.get("retired"):
        return
    seq = e["collective_seq_id"]
    is_p2p = bool(e.get("is_p2p")) or (seq == 0 and e.get("p2p_seq_id", 0) > 0)
    pg = e["process_group"]
    out.append(OpenOp(lib, str(pg[0]), str(pg[1]), e.get("p2p_seq_id", 0) if is_p2p else seq,
                      e["profiling_name"].rpartition(":")[2], is_p2p, e.get("state", ""),
                      e.get("time_created_ns") or 0, format_frames(e.get("frames"))))


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
