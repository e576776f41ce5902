"""A digest (:mod:`digest`) back into the dump files the analyzer reads, on the summarizing rank.

A digest comes from the job's store, which anyone who reaches it can write: it is hostile input.
Its size is capped before it is parsed (the caller's announcement cap, and ``MAX_DIGEST_JSON``),
every table and list has a count cap, every field a type and a range, every name a pattern, and
the rank comes from the store key, not from the digest. A digest that breaks any of it raises
:class:`DigestError` with the reason; nothing of it is written.

Example::

    files = expand_digest(raw, rank=3, world_size=8)   # {"rank_00003.gloo.fr.pkl": b"...", ...}
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass
from typing import Any, Callable

from lightning_ncclx.dump.digest import CONTEXT_FIELDS, DIGEST_SCHEMA, MAX_TEXT
from lightning_ncclx.layout import CONTEXT_SUFFIX, STACKS_SUFFIX, rank_file, trace_file

MAX_DIGEST_JSON = 1 << 20
MAX_TRACES = 8
MAX_TABLE = 1024
"""Distinct groups, signatures, states, file names or frame lists in one trace of a digest."""
MAX_ENTRIES = 4096
MAX_SHAPES = 64
MAX_DIMS = 16
MAX_STACK_FRAMES = 16
MAX_FRAMES = 16
MAX_TIME_NS = 1 << 63
TAG_PATTERN = re.compile(r"^[a-z0-9_]{1,32}$")

Runs = tuple[tuple[int, int, int], ...]
KeepDeclaration = Callable[[str, str, Runs], bool]
"""Whether to write one ``pg_config`` row (name, desc, member runs) into the expanded trace: the
gather writes each distinct membership into a few files only (a 16,384-rank list in 16,384
files would be gigabytes); the analyzer takes a group's members from the dumps that declare them."""


class DigestError(ValueError):
    """A digest that is not what :func:`~lightning_ncclx.dump.digest.make_digest` writes."""


def _int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value < high:
        raise DigestError(f"{what}: {_show(value)} is not an integer in [{low}, {high})")
    return value


def _str(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise DigestError(f"{what}: {_show(value)} is not a string of at most {limit} characters")
    return value


def _list(value: Any, what: str, limit: int) -> list:
    if not isinstance(value, list) or len(value) > limit:
        raise DigestError(f"{what}: not a list of at most {limit} items")
    return value


def _index(value: Any, table: list, what: str, optional: bool = False) -> int:
    return _int(value, what, -1 if optional else 0, len(table))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shapes(value: Any, what: str) -> list:
    out = []
    for shape in _list(value, what, MAX_SHAPES):
        if type(shape) is int:
            out.append(_int(shape, what, -1, 1 << 62))
        else:
            out.append([_int(n, what, -1, 1 << 62) for n in _list(shape, what, MAX_DIMS)])
    return out


def _dtypes(value: Any, what: str) -> list[str]:
    return [_str(d, what, 64) for d in _list(value, what, MAX_SHAPES)]


def _signature(value: Any) -> dict[str, Any]:
    row = _list(value, "signature", 5)
    if len(row) != 5:
        raise DigestError("signature: not five fields")
    ins, in_types = _shapes(row[1], "input sizes"), _dtypes(row[2], "input dtypes")
    return {"profiling_name": _str(row[0], "profiling name", 200), "input_sizes": ins, "input_dtypes": in_types,
            "output_sizes": ins if row[3] is None else _shapes(row[3], "output sizes"),
            "output_dtypes": in_types if row[4] is None else _dtypes(row[4], "output dtypes")}


def member_runs(runs: Any, world_size: int) -> Runs | None:
    """Checked runs ``(start, count, step)`` of a member list (None: the digest left it out);
    every member is a rank of the job, and there are at most ``world_size`` of them."""
    if runs is None:
        return None
    out: list[tuple[int, int, int]] = []
    total = 0
    for run in _list(runs, "group members", 64):
        start, count, step = (_list(run, "member run", 3) + [None, None, None])[:3]
        start = _int(start, "member run start", 0, world_size)
        count = _int(count, "member run length", 1, world_size + 1)
        step = _int(step, "member run step", 1, world_size + 1)
        total += count
        if start + (count - 1) * step >= world_size or total > world_size:
            raise DigestError(f"group members: a run past the job's {world_size} ranks")
        out.append((start, count, step))
    return tuple(out)


def members_text(runs: Runs) -> str:
    """Runs as torch writes a member list: ``"[0, 1, 2]"``."""
    return "[" + ", ".join(", ".join(map(str, range(a, a + n * step, step))) for a, n, step in runs) + "]"


def _pg_config(rows: Any, world_size: int, keep: KeepDeclaration) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for row in _list(rows, "pg_config", MAX_TABLE):
        name, desc, runs = (_list(row, "pg_config row", 3) + [None, None, None])[:3]
        name, desc = _str(name, "group name", 200), _str(desc, "group description", 200)
        checked = member_runs(runs, world_size)
        if checked is not None and keep(name, desc, checked):
            out[name] = {"name": name, "desc": desc, "ranks": members_text(checked)}
    return out


def _frames(doc: dict[str, Any]) -> list[list[dict[str, Any]]]:
    files = [_str(f, "frame file name") for f in _list(doc.get("files", []), "frame file names", MAX_TABLE)]
    out = []
    for frames in _list(doc.get("frames", []), "frame lists", MAX_TABLE):
        listed = []
        for frame in _list(frames, "frame list", MAX_FRAMES):
            file_index, line, func = (_list(frame, "frame", 3) + [None, None, None])[:3]
            listed.append({"filename": files[_index(file_index, files, "frame file")],
                           "line": _int(line, "frame line", -1, 1 << 31), "name": _str(func, "frame function")})
        out.append(listed)
    return out


class _Tables:
    """A trace's tables, checked: groups, signatures, states, frame lists."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.groups = [(_str(n, "group name", 200), _str(d, "group description", 200)) for n, d in
                       (_pair(g) for g in _list(doc.get("groups", []), "groups", MAX_TABLE))]
        self.sigs = [_signature(s) for s in _list(doc.get("sigs", []), "signatures", MAX_TABLE)]
        self.states = [_str(s, "state", 32) for s in _list(doc.get("states", []), "states", 16)]
        self.frames = _frames(doc)


def _column(value: Any, what: str, n: int, low: int, high: int, optional: bool = False) -> list:
    """``n`` integers in ``[low, high)`` (None too where ``optional``), checked in bulk."""
    values = _list(value, what, n)
    present = [v for v in values if v is not None] if optional else values
    if len(values) != n or not set(map(type, present)) <= {int} or (present and (min(present) < low or max(present) >= high)):
        raise DigestError(f"{what}: not {n} integers in [{low}, {high})")
    return values


def _lane(value: Any, tables: _Tables, newest: int, budget: int) -> list[dict[str, Any]]:
    """One lane's entries, newest first (see :mod:`digest`)."""
    row = _list(value, "lane", 9)
    if len(row) != 9:
        raise DigestError("lane: not nine fields")
    group = tables.groups[_index(row[0], tables.groups, "lane group")]
    p2p = bool(_int(row[1], "lane is_p2p", 0, 2))
    n = len(_list(row[2], "lane sequence ids", budget))
    steps = _column(row[2], "lane sequence ids", n, -(1 << 62), 1 << 62)
    p2p_seqs = [0] * n if row[3] == 0 else _column(row[3], "lane p2p sequence ids", n, 0, 1 << 62)
    sigs = _column(row[4], "lane signatures", n, 0, len(tables.sigs))
    states = _column(row[5], "lane states", n, -1, len(tables.states))
    retired = _column(row[6], "lane retired", n, 0, 2)
    backs = _column(row[7], "lane times", n, -MAX_TIME_NS // 1000, MAX_TIME_NS // 1000, optional=True)
    frames = _column(row[8], "lane frames", n, -1, len(tables.frames))
    out: list[dict[str, Any]] = []
    seq, time = None, newest
    for i in range(n):
        seq = steps[i] if seq is None else seq - steps[i]
        if not 0 <= seq < 1 << 62:
            raise DigestError(f"entry sequence id: {seq} out of range")
        if backs[i] is not None:
            time -= 1000 * backs[i]
            if not 0 <= time < MAX_TIME_NS:
                raise DigestError(f"entry time: {time} out of range")
        entry = {"record_id": 0, "process_group": group, "collective_seq_id": seq, "p2p_seq_id": p2p_seqs[i],
                 "is_p2p": p2p, "time_created_ns": time if backs[i] is not None else None, "retired": bool(retired[i]),
                 **tables.sigs[sigs[i]], "frames": tables.frames[frames[i]] if frames[i] >= 0 else []}
        if states[i] >= 0:
            entry["state"] = tables.states[states[i]]
        out.append(entry)
    return out


def _entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every lane's entries merged back into file order (``order``: the lane of each entry,
    newest first), with record ids from 0."""
    tables = _Tables(doc)
    newest = _int(doc.get("t0", 0), "newest time", 0, MAX_TIME_NS)
    lanes: list[list[dict[str, Any]]] = []
    budget = MAX_ENTRIES
    for value in _list(doc.get("lanes", []), "lanes", MAX_TABLE):
        lanes.append(_lane(value, tables, newest, budget))
        budget -= len(lanes[-1])
    total = sum(map(len, lanes))
    order = doc.get("order")
    if order is None:
        if len(lanes) > 1:
            raise DigestError("several lanes without their order")
        order = [0] * total
    order = _list(order, "entry order", total)
    taken = [0] * len(lanes)
    out: list[dict[str, Any]] = []
    for lane in order:
        lane = _index(lane, lanes, "entry lane")
        if taken[lane] >= len(lanes[lane]):
            raise DigestError("entry order: more entries of a lane than it holds")
        out.append(lanes[lane][taken[lane]])
        taken[lane] += 1
    if len(out) != total:
        raise DigestError("entry order: not every entry placed")
    out.reverse()
    for number, entry in enumerate(out):
        entry["record_id"] = number
    return out


def _pair(value: Any) -> list:
    pair = _list(value, "group", 2)
    if len(pair) != 2:
        raise DigestError("group: not a (name, description) pair")
    return pair


def _trace(doc: Any, world_size: int, keep: KeepDeclaration) -> tuple[str, dict[str, Any]]:
    if not isinstance(doc, dict):
        raise DigestError("trace: not an object")
    tag = doc.get("tag")
    if not isinstance(tag, str) or not TAG_PATTERN.match(tag):
        raise DigestError(f"trace tag {_show(tag)} is not a backend name")
    version = _str(doc.get("version", ""), "trace version", 16)
    trace = {"version": version, "comm_lib_version": _str(doc.get("comm", ""), "comm library version", 100),
             "pg_config": _pg_config(doc.get("pg_config", []), world_size, keep), "entries": _entries(doc)}
    return tag, trace


def _context(value: Any, rank: int, world_size: int) -> dict[str, Any]:
    """The digest's context fields; the rank and the job's size are the summarizing rank's own."""
    if not isinstance(value, dict) or len(value) > 64:
        raise DigestError("context: not an object of at most 64 fields")
    out: dict[str, Any] = {}
    for key in CONTEXT_FIELDS:
        field = value.get(key)
        if isinstance(field, str):
            out[key] = _str(field, f"context {key}")
        elif type(field) in (int, float) and field == field and abs(field) < 1e15:
            out[key] = field
    out.update(rank=rank, world_size=world_size, digest=True)
    return out


def _stacks(value: Any) -> str | None:
    frames = _list(value, "main thread stack", MAX_STACK_FRAMES)
    if not frames:
        return None
    lines = ["--- thread 'MainThread' (digest) ---\n"]
    for frame in frames:
        filename, line, func = (_list(frame, "stack frame", 3) + [None, None, None])[:3]
        filename = _str(filename, "stack file name")
        func = _str(func, "stack function")
        if '"' in filename or "\n" in filename + func:
            raise DigestError("stack frame: a name that would break the stacks file")
        lines.append(f'  File "{filename}", line {_int(line, "stack line", 0, 1 << 31)}, in {func}\n')
    return "".join(lines)


@dataclass
class Expanded:
    """One rank's dump as its digest describes it: what each file holds, before it is written."""

    rank: int
    traces: dict[str, dict[str, Any]]
    """File name -> the flight-recorder trace (torch's format)."""
    context: dict[str, Any]
    stacks: str | None

    def files(self) -> dict[str, bytes]:
        """File name -> contents (traces, ``context.json``, the stacks file)."""
        out = {name: pickle.dumps(trace, protocol=4) for name, trace in self.traces.items()}
        if self.stacks is not None:
            out[rank_file(self.rank, STACKS_SUFFIX)] = self.stacks.encode()
        out[rank_file(self.rank, CONTEXT_SUFFIX)] = json.dumps(self.context).encode()
        return out


def expand(raw: bytes, rank: int, world_size: int,
           keep: KeepDeclaration = lambda name, desc, runs: True) -> Expanded:
    """Rank ``rank``'s dump as the digest ``raw`` describes it, every field checked (its
    ``context.json`` marked ``"digest": true``). Raises :class:`DigestError`."""
    if len(raw) > MAX_DIGEST_JSON:
        raise DigestError(f"{len(raw)} bytes, over the {MAX_DIGEST_JSON}-byte cap")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
        raise DigestError(f"not JSON ({type(error).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema") != DIGEST_SCHEMA:
        raise DigestError(f"not a digest of this version ({DIGEST_SCHEMA} expected)")
    traces: dict[str, dict[str, Any]] = {}
    for item in _list(doc.get("traces", []), "traces", MAX_TRACES):
        tag, trace = _trace(item, world_size, keep)
        traces[trace_file(rank, tag)] = trace
    context = _context(doc.get("context", {}), rank, world_size)
    context["trace_files"] = sorted(traces)
    stacks = _stacks(doc.get("stack", []))
    if stacks is not None:
        context["stacks_file"] = rank_file(rank, STACKS_SUFFIX)
    return Expanded(rank, traces, context, stacks)


def expand_digest(raw: bytes, rank: int, world_size: int,
                  keep: KeepDeclaration = lambda name, desc, runs: True) -> dict[str, bytes]:
    """File name -> contents of rank ``rank``'s dump as the digest ``raw`` describes it (see
    :func:`expand`). Raises :class:`DigestError`."""
    return expand(raw, rank, world_size, keep).files()
