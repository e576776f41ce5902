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


def _freeze(sizes: Any) -> tuple:
    if not isinstance(sizes, list):
        return ()
    try:
        return tuple(map(tuple, sizes))
    except TypeError:
        return tuple(sizes)


class _Acc:
    __slots__ = ("desc", "seqs", "sigs", "done", "times", "calls", "states")

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.seqs: list[int] = []
        self.sigs: list[tuple] = []
        self.done: list[bool] = []
        self.times: list[int] = []
        self.calls: list[str | None] = []
        self.states: list[str] = []

    def add(self, seq: int, sig: tuple, done: bool, t: int, call: str | None, state: str) -> None:
        if self.seqs and self.seqs[-1] == seq:  # coalesced: several entries share one sequence id
            self.sigs[-1] = _merge(self.sigs[-1], sig)
            self.done[-1] = self.done[-1] and done
            self.calls[-1] = self.calls[-1] or call
            return
        self.seqs.append(seq)
        self.sigs.append(sig)
        self.done.append(done)
        self.times.append(t)
        self.calls.append(call)
        self.states.append(state)


def _merge(a: tuple, b: tuple) -> tuple:
    op = a[0] if b[0] in (a[0], "coalesced") else (b[0] if a[0] == "coalesced" else f"{a[0]}+{b[0]}")
    return (op, a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


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
    groups: dict[str, _Acc] = {}
    p2p: list[P2POp] = []
    open_ops: list[OpenOp] = []
    libs: set[str] = set()
    newest = 0
    for e in entries:
        lib, _, name = e["profiling_name"].rpartition(":")
        libs.add(lib)
        pg = e["process_group"]
        gname, desc = str(pg[0]), str(pg[1])
        state = e.get("state", "")
        done = bool(e.get("retired")) if lib == "gloo" else (state == "completed" or bool(e.get("retired")))
        t = e.get("time_created_ns") or 0
        if t > newest:
            newest = t
        seq = e.get("collective_seq_id", 0)
        is_p2p = bool(e.get("is_p2p")) or (seq == 0 and e.get("p2p_seq_id", 0) > 0)
        if is_p2p:
            p2p.append(_p2p(gname, name, e.get("p2p_seq_id", 0), done))
        else:
            acc = groups.get(gname)
            if acc is None:
                acc = groups[gname] = _Acc(desc)
            sig = (name, _freeze(e.get("input_sizes")), tuple(e.get("input_dtypes") or ()),
                   _freeze(e.get("output_sizes")), tuple(e.get("output_dtypes") or ()))
            acc.add(seq, sig, done, t, innermost_user_frame(e.get("frames")), state)
        if not done:
            open_ops.append(OpenOp(lib, gname, desc, e.get("p2p_seq_id", 0) if is_p2p else seq, name, is_p2p,
                                   state, t, format_frames(e.get("frames"))))
    lib = _pick_lib(libs, lib_hint)
    tracks = {g: GroupTrack(lib, g, a.desc, tuple(a.seqs), tuple(a.sigs), tuple(a.done), tuple(a.times),
                            tuple(a.calls), tuple(a.states)) for g, a in groups.items()}
    return RankTrace(rank, lib, path, version, parse_pg_config(dump.get("pg_config")), tracks, tuple(p2p),
                     tuple(open_ops), len(entries), newest)


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
