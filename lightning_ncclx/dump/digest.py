"""A rank's dump cut down to what a first diagnosis needs: the frontier of every group, in one
small JSON document (about 300 bytes per rank once its announcement is compressed with a preset
dictionary, :mod:`lightning_ncclx.events.wire`).

The two-phase gather (:mod:`lightning_ncclx.events.two_phase`) sends every rank's digest through
the store and full dumps only from the smaller side of the first diagnosis and a few peers, so an
event at 16k ranks moves megabytes, not gigabytes. The summarizing rank expands each digest back
into the files every dump has (:mod:`digest_expand`), so the analyzer reads a digest like a dump
whose ring buffer held fewer entries.

The document (``schema`` ``lightning-ncclx/digest/2``)::

    {"schema": ..., "context": {<CONTEXT_FIELDS of context.json>},
     "stack": [[file, line, function], ...],          # main thread, outermost first
     "traces": [{"tag": "nccl", "version": "2.10", "comm": "2.28.9", "t0": <newest time, ns>,
                 "pg_config": [[name, desc, [[start, count, step], ...] or null], ...],
                 "groups": [[name, desc], ...], "sigs": [[profiling name, input sizes, input
                 dtypes, output sizes or null (= input), output dtypes or null], ...],
                 "states": [...], "files": [...], "frames": [[[file index, line, function]], ...],
                 "lanes": [[group, is_p2p, seqs, p2p seqs or 0, sigs, states, retired, times,
                            frames], ...],
                 "order": [lane of each entry, newest first] or null (one lane)}]}

A lane is one group's collectives (or its p2p ops), newest first, column by column: ``seqs`` the
newest sequence id then each step back to the next older; ``times`` microseconds back from the
entry before (the first from ``t0``), null where an entry has no time; the other columns index
the tables (``-1``: none). Of each trace a digest keeps:

- per lane the newest ``ENTRIES_PER_GROUP`` entries, reaching back to the newest finished one (NCCL
  queues collectives ahead of the device), at most ``MAX_ENTRIES_PER_GROUP``, in one unbroken run;
- of each entry's stack its innermost user frame (the call site the analyzer compares and shows);
- ``pg_config``, member lists as runs (a 16,384-rank list is one run; a list of more than
  ``MAX_MEMBER_RUNS`` runs is left out: the analyzer then takes the group's members from the
  dumps that declare them).

Of ``context.json`` it keeps the scalar fields in ``CONTEXT_FIELDS``; of the stacks file the main
thread's innermost user frame and the frame that names what it waits in (data loader,
checkpoint, ...): all the analyzer takes from a stacks file.

Example::

    raw = make_digest([trace_path, context_path, stacks_path])     # JSON bytes
    files = expand_digest(raw, rank=3, world_size=8)                # name -> bytes (digest_expand)
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable

from lightning_ncclx.analysis.frames import format_frame, innermost_user_frame, main_thread_activity, main_thread_user_frame
from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.layout import CONTEXT_SUFFIX, RANK_PREFIX, STACKS_SUFFIX, TRACE_SUFFIX

log = logging.getLogger(__name__)

DIGEST_SCHEMA = "lightning-ncclx/digest/2"
ENTRIES_PER_GROUP = 4
MAX_ENTRIES_PER_GROUP = 16
MAX_MEMBER_RUNS = 64
MAX_STACKS_CHARS = 1 << 20
CONTEXT_FIELDS = ("event", "reason", "initiator_rank", "host", "phase", "step", "exception")
"""The ``context.json`` fields a digest carries: those the analyzer reads (the summarizing rank
writes the rank and the job's size itself; the other fields stay in the full dump)."""
MAX_TEXT = 512
"""Characters of any one string a digest carries (the exception text, a file name, ...)."""

COMMON_WORDS = (
    "/lib/python3.11/threading.py", "/lib/python3.10/threading.py", "/lib/python3.12/queue.py",
    "/site-packages/torch/utils/data/dataloader.py", "_next_data", "__next__", "_get_data", "_try_get_data",
    "/site-packages/torch/nn/modules/module.py", "_call_impl", "_wrapped_call_impl", "forward",
    "/site-packages/torch/nn/parallel/distributed.py", "_run_ddp_forward", "_pre_forward",
    "/site-packages/torch/autograd/__init__.py", "/site-packages/torch/_tensor.py", "backward", "_engine_run_backward",
    "/site-packages/torch/distributed/fsdp/", "/site-packages/torch/distributed/checkpoint/",
    "/site-packages/lightning/pytorch/loops/optimization/automatic.py", "/site-packages/lightning/pytorch/core/module.py",
    "/site-packages/lightning/pytorch/loops/training_epoch_loop.py", "/site-packages/lightning/pytorch/loops/fit_loop.py",
    "/site-packages/lightning/pytorch/trainer/trainer.py", "/site-packages/lightning/pytorch/trainer/call.py",
    "/site-packages/lightning/pytorch/strategies/ddp.py", "advance", "run", "_run", "_run_stage", "fit", "_fit_impl",
    "training_step", "optimizer_step", "step", "<module>", "main", "wrapper", "barrier", "broadcast", "all_gather",
    "reduce_scatter", "_allgather_base", "_reduce_scatter_base", "all_gather_into_tensor", "reduce_scatter_tensor",
    "nccl:broadcast", "nccl:all_gather", "nccl:reduce_scatter", "nccl:send", "nccl:recv", "nccl:_allgather_base",
    "gloo:broadcast", "gloo:all_gather", "gloo:barrier", "gloo:send", "gloo:recv",
    '"context":{"event":"stall-00', '"reason":"stall","initiator_rank":', '"reason":"peer_request","initiator_rank":0,',
    '"local_rank":0,"node_rank":', '"pid":', '"phase":"validation","step":', '"phase":"train_step","step":',
    '"global_step":', '"seconds_since_heartbeat":', '"stall_threshold_seconds":', '"time_unix":17',
    '"torch_version":"2.15.0+cu', '"lightning_version":"2.', '"nccl_version":"2.', '"stall_events":1',
    '"exception":"', '"stack":[["', '"files":["', '/site-packages/torch/distributed/c10d_logger.py",',
    '/site-packages/torch/distributed/distributed_c10d.py",', '"frames":[[[0,', ',"wrapper"],[', ',"all_reduce"],[',
    '"entries":[[0,', '"states":["completed","started","scheduled"]', '"states":["scheduled"]',
    '"sigs":[["gloo:all_reduce",[[', '"sigs":[["nccl:all_reduce",[[', '["BFloat16"],null,null]',
    '["Float"],null,null],[',
    '"groups":[["0","default_pg"]]', '"pg_config":[["0","default_pg",[[0,', '"t0":17',
    '"traces":[{"tag":"gloo","version":"2.10","comm":"",', '"traces":[{"tag":"nccl","version":"2.10","comm":"2.',
    '{"schema":"lightning-ncclx/digest/2","context":{"event":"stall-00', '"world_size":', '"host":"', '"rank":',
)
"""Strings most digests hold, most common last: the preset dictionary of the compressed
announcement starts from them (:data:`lightning_ncclx.events.wire.ANNOUNCEMENT_DICTIONARY`)."""

_FRAME_LINE = re.compile(r'File "([^"\n]{1,4096})", line (\d{1,12}),? in ([^\n]*)')


def member_runs(ranks: Iterable[int]) -> list[list[int]] | None:
    """``[0, 1, 2, 3, 8, 10]`` -> ``[[0, 4, 1], [8, 2, 2]]`` (start, count, step); None when the
    list needs more than ``MAX_MEMBER_RUNS`` runs or is not a list of ranks."""
    values = list(ranks)
    if not set(map(type, values)) <= {int} or (values and min(values) < 0):
        return None
    if len(values) > 2 and values[1] > values[0]:  # most groups are one run: compared in C
        step = values[1] - values[0]
        if values == list(range(values[0], values[0] + step * len(values), step)):
            return [[values[0], len(values), step]]
    runs: list[list[int]] = []
    i = 0
    while i < len(values):
        step = values[i + 1] - values[i] if i + 1 < len(values) else 1
        j = i + 1
        while step > 0 and j < len(values) and values[j] - values[j - 1] == step:
            j += 1
        if step <= 0:
            step, j = 1, i + 1
        runs.append([values[i], j - i, step])
        if len(runs) > MAX_MEMBER_RUNS:
            return None
        i = j
    return runs


def _members(raw: Any) -> list[list[int]] | None:
    if isinstance(raw, str):
        if len(raw) > 16 << 20:
            return None
        try:
            parsed = json.loads(raw)
        except ValueError:
            return None
        return member_runs(parsed) if isinstance(parsed, list) else None
    if isinstance(raw, (list, tuple)):
        return member_runs(raw)
    return None


class _Table:
    """Distinct values in first-seen order; ``index`` adds."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._at: dict[str, int] = {}

    def index(self, value: Any) -> int:
        key = json.dumps(value, separators=(",", ":"))
        if key not in self._at:
            self._at[key] = len(self.values)
            self.values.append(value)
        return self._at[key]


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else str(value)[:MAX_TEXT]


def _is_done(entry: dict) -> bool:
    return bool(entry.get("retired")) or entry.get("state") == "completed"


def _frontier(entries: list[Any]) -> list[dict]:
    """Of each group's entries (collectives and p2p apart): the newest ``ENTRIES_PER_GROUP``,
    reaching back to the newest finished one (NCCL queues collectives ahead of the device) but
    never past ``MAX_ENTRIES_PER_GROUP``; one unbroken run per group, in file order."""
    lanes: dict[tuple[str, bool], list[int]] = {}
    for index, entry in enumerate(entries):
        if isinstance(entry, dict):
            group = entry.get("process_group")
            name = str(group[0]) if isinstance(group, (list, tuple)) and group else "?"
            lanes.setdefault((name, bool(entry.get("is_p2p"))), []).append(index)
    kept: list[int] = []
    for indices in lanes.values():
        n = len(indices)
        done = [i for i, index in enumerate(indices) if _is_done(entries[index])]
        start = min(n - ENTRIES_PER_GROUP, done[-1]) if done else n - ENTRIES_PER_GROUP
        kept += indices[max(0, n - MAX_ENTRIES_PER_GROUP, start):]
    return [entries[i] for i in sorted(kept)]


def _frame(fr: Any, files: _Table) -> list[Any] | None:
    if not isinstance(fr, dict):
        return None
    line = fr.get("line")
    return [files.index(_text(fr.get("filename"))), line if type(line) is int else -1, _text(fr.get("name"))]


def _kept_frames(entry: dict, files: _Table) -> list[list[Any]]:
    """The entry's innermost user frame: its call site, which is what the analyzer compares and
    shows (the library frames inside it name the op its profiling name names)."""
    frames = entry.get("frames")
    if not isinstance(frames, list) or not frames:
        return []
    dicts = [fr for fr in frames if isinstance(fr, dict)]
    user = innermost_user_frame(dicts)
    chosen = next((fr for fr in dicts if innermost_user_frame([fr]) == user), None)
    kept = _frame(chosen, files)
    return [kept] if kept is not None else []


def _sizes(value: Any) -> Any:
    return value if isinstance(value, (list, tuple)) else []


def _signature(e: dict) -> list[Any]:
    """(profiling name, input sizes, input dtypes, output sizes, output dtypes); an output equal
    to the input as None (most ops)."""
    ins, in_types = _sizes(e.get("input_sizes")), _sizes(e.get("input_dtypes"))
    outs, out_types = _sizes(e.get("output_sizes")), _sizes(e.get("output_dtypes"))
    return [_text(e.get("profiling_name")), ins, in_types, None if outs == ins else outs,
            None if out_types == in_types else out_types]


class _Lane:
    """One group's collectives (or its p2p ops), newest first, as columns."""

    def __init__(self, group: int, p2p: int) -> None:
        self.head = [group, p2p]
        self.columns: list[list[Any]] = [[] for _ in range(7)]
        self.seq: int | None = None
        self.time: int | None = None

    def add(self, seq: int, time: int | None, newest: int, values: list[Any]) -> None:
        seqs, p2p, sigs, states, retired, backs, frames = self.columns
        seqs.append(seq if self.seq is None else self.seq - seq)
        self.seq = seq
        start = self.time if self.time is not None else newest
        back = None if time is None else round((start - time) / 1000)
        backs.append(back)
        if back is not None:  # from the time the reader will rebuild: rounding errors do not add up
            self.time = start - 1000 * back
        for column, value in zip((p2p, sigs, states, retired, frames), values):
            column.append(value)

    def doc(self) -> list[Any]:
        seqs, p2p, sigs, states, retired, backs, frames = self.columns
        return self.head + [seqs, p2p if any(p2p) else 0, sigs, states, retired, backs, frames]


def _trace_doc(trace: Any, tag: str) -> dict[str, Any]:
    if not isinstance(trace, dict) or not isinstance(trace.get("entries", []), list):
        raise ValueError("not a flight-recorder trace")
    sigs, frames, files, groups, states = _Table(), _Table(), _Table(), _Table(), _Table()
    kept = _frontier(trace.get("entries", []))
    newest = max((e.get("time_created_ns") for e in kept if type(e.get("time_created_ns")) is int), default=0)
    lanes: dict[tuple[int, int], _Lane] = {}
    order: list[int] = []
    for e in reversed(kept):  # newest first: sequence ids and times as steps back
        pg = e.get("process_group")
        g = groups.index([_text(pg[0]), _text(pg[1])] if isinstance(pg, (list, tuple)) and len(pg) == 2 else ["?", "?"])
        key = (g, 1 if e.get("is_p2p") else 0)
        lane = lanes.setdefault(key, _Lane(*key))
        order.append(list(lanes).index(key))
        seq, p2p, t = e.get("collective_seq_id"), e.get("p2p_seq_id"), e.get("time_created_ns")
        kept_frames = _kept_frames(e, files)
        lane.add(seq if type(seq) is int else 0, t if type(t) is int else None, newest,
                 [p2p if type(p2p) is int else 0, sigs.index(_signature(e)),
                  states.index(_text(e.get("state"))) if e.get("state") is not None else -1,
                  1 if e.get("retired") else 0, frames.index(kept_frames) if kept_frames else -1])
    config = trace.get("pg_config")
    pgs = []
    for name, group in (config.items() if isinstance(config, dict) else ()):
        if isinstance(group, dict):
            pgs.append([_text(group.get("name", name)), _text(group.get("desc", "")), _members(group.get("ranks"))])
    comm = trace.get("comm_lib_version")
    return {"tag": tag, "version": _text(trace.get("version", "")), "comm": comm[:100] if isinstance(comm, str) else "",
            "t0": newest, "pg_config": pgs, "groups": groups.values, "sigs": sigs.values, "states": states.values,
            "files": files.values, "frames": frames.values, "lanes": [lane.doc() for lane in lanes.values()],
            "order": order if len(lanes) > 1 else None}


def _context_doc(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("context.json is not an object")
    out: dict[str, Any] = {}
    for key in CONTEXT_FIELDS:
        value = data.get(key)
        if isinstance(value, str):
            out[key] = value[:MAX_TEXT]
        elif isinstance(value, (int, float)) and value == value and abs(value) < 1e15:
            out[key] = value
    return out


def _stack_doc(text: str) -> list[list[Any]]:
    """The main thread's frames the analyzer reads (its innermost user frame and the one that
    names its wait), outermost first, as in the stacks file."""
    wanted = {main_thread_user_frame(text)}
    activity = main_thread_activity(text)
    kept: list[list[Any]] = []
    for match in _FRAME_LINE.finditer(_main_section(text)):
        filename, line, func = match[1], int(match[2]), match[3].strip()
        shown = format_frame(filename, line, func)
        if shown in wanted or (activity is not None and activity.endswith(": " + shown)):
            kept.append([filename[:MAX_TEXT], line, func[:MAX_TEXT]])
            wanted.discard(shown)
    return kept


def _main_section(text: str) -> str:
    start = text.find("--- thread 'MainThread'")
    if start < 0:
        return text
    end = text.find("\n--- thread ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def make_digest(files: Iterable[Path]) -> bytes:
    """The digest of one rank's dump files, as compact JSON. A file that cannot be cut down is
    left out (the full dump stays on the rank's disk); raises ValueError when nothing is left."""
    doc: dict[str, Any] = {"schema": DIGEST_SCHEMA, "context": {}, "stack": [], "traces": []}
    for path in files:
        name = path.name
        try:
            if name.endswith("." + TRACE_SUFFIX) and name.startswith(RANK_PREFIX):
                tag = name.split(".", 1)[1][:-len("." + TRACE_SUFFIX)]
                doc["traces"].append(_trace_doc(safe_loads(path.read_bytes()), tag))
            elif name.endswith("." + CONTEXT_SUFFIX):
                doc["context"] = _context_doc(path.read_bytes())
            elif name.endswith("." + STACKS_SUFFIX):
                with open(path, "rb") as handle:
                    doc["stack"] = _stack_doc(handle.read(MAX_STACKS_CHARS).decode("utf-8", errors="replace"))
        except Exception:  # noqa: BLE001 - a digest is an optimization: never fail the event over it
            log.warning("could not make a digest of %s", path, exc_info=True)
    if not doc["traces"] and not doc["context"]:
        raise ValueError("no trace and no context to make a digest of")
    return json.dumps(doc, separators=(",", ":"), default=str).encode()
