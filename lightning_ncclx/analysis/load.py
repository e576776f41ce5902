"""The only I/O stage: find dump files under one or more roots by content, read them safely,
compact them.

Discovery and rank naming: :mod:`discover` (any name, pickle / JSON / gzip, this plugin's layout
and ``context.json`` first). Every byte comes through :mod:`safe_read` (regular files, capped).
A file that looks like a dump but is not readable lands in ``unreadable`` with the reason; a file
that is not a dump at all in ``ignored``; the same rank and backend found twice keeps the dump
with the newest entries and lists both under ``duplicates``.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import logging
import os
import re
import sys
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from lightning_ncclx.analysis import json_stream
from lightning_ncclx.analysis.collection_file import read_collection
from lightning_ncclx.analysis.discover import CONTEXT, STACKS, Candidate, Discovery, discover, refusal, sniff
from lightning_ncclx.analysis.frames import main_thread_activity, main_thread_user_frame
from lightning_ncclx.analysis.model import Duplicate, LoadedFolder, RankContext, RankTrace, Unreadable
from lightning_ncclx.analysis.members import MembershipsSent, SharedMemberships
from lightning_ncclx.analysis.p2p import p2p_from_context
from lightning_ncclx.analysis.reader_helper import START_S, HelperUnavailable, call_in_helper
from lightning_ncclx.analysis.reader_pool import deadline_s, fork_safe, read_isolated
from lightning_ncclx.analysis.parse import MAX_ENTRIES, MAX_RANK, build_trace, parse_pg_config
from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.analysis.safe_read import (DECODE_BUDGET_BYTES, MAX_SIDE_FILE_BYTES, MAX_TRACE_BYTES,
                                                SNIFF_BYTES, bounded_memory, human_bytes, read_regular)
from lightning_ncclx.errors import DumpReadError

log = logging.getLogger(__name__)

FILES_PER_WORKER = 12  # below this many files per process, another process costs more than it saves
MAX_WORKERS = 16


class NotADump(Unreadable):
    """A file that parsed but is no flight-recorder dump, under a name that does not claim one."""


def read_candidate(c: Candidate) -> RankTrace | Unreadable:
    """Read and compact one candidate file; never raises for bad input."""
    was_enabled = gc.isenabled()
    gc.disable()  # a dump is thousands of acyclic containers: the collector only costs time here
    try:
        held = [read_regular(c.path, MAX_TRACE_BYTES, "dump")]
        refused = None if c.fmt else refusal(held[0][:SNIFF_BYTES])
        if refused is not None:
            return (NotADump if refused[0] else Unreadable)(c.path, refused[1])
        with bounded_memory(max(DECODE_BUDGET_BYTES - len(held[0]), 64 << 20)):
            try:
                data, fmt, total = _decode(held)
            except DumpReadError as exc:
                return (Unreadable if c.named_like_dump else NotADump)(c.path, str(exc))
            if not _looks_like_dump(data) and not c.named_like_dump:
                return NotADump(c.path, "not a flight-recorder dump (no 'version' or 'entries' key)")
            trace = build_trace(data, c.rank if c.rank is not None else -1, c.path, c.lib_hint, total)
        return _with_rank(trace, c, data, fmt)
    except DumpReadError as exc:
        return Unreadable(c.path, str(exc))
    except MemoryError:
        return Unreadable(c.path, f"needs more than the {human_bytes(DECODE_BUDGET_BYTES)} memory cap to load (a "
                                  "hostile or corrupt pickle, or a dump too large to decode whole)")
    finally:
        if was_enabled:
            gc.enable()


def _with_rank(trace: RankTrace, c: Candidate, data: dict, fmt: str) -> RankTrace | Unreadable:
    content = data.get("rank")
    stated = content if isinstance(content, int) and not isinstance(content, bool) and 0 <= content < MAX_RANK else None
    if stated is not None:
        return replace(trace, rank=stated, rank_from="content", fmt=fmt)
    if c.rank is not None:
        return replace(trace, rank=c.rank, rank_from=c.rank_from, fmt=fmt)
    if c.explicit:
        return replace(trace, rank=0, rank_from="default (one file given)", fmt=fmt)
    return Unreadable(c.path, "a flight-recorder dump, but nothing says which rank wrote it: name it "
                              "rank_<N>.<ext> (e.g. rank_3.pkl) or put it in a folder named rank_<N>")


def _looks_like_dump(data: object) -> bool:
    return isinstance(data, dict) and ("version" in data or "entries" in data)


def _decode(held: list[bytes]) -> tuple[object, str, int]:
    """(document, format, entries it held) from the one raw buffer in ``held``, which is taken
    out of it: a 200 MB JSON dump must not live twice, as bytes and as text."""
    if sniff(held[0][:16]) == "gzip":
        raw = held.pop()
        try:
            inner = gzip.GzipFile(fileobj=io.BytesIO(raw)).read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise DumpReadError(f"not a valid gzip file ({str(exc)[:80]})") from None
        del raw
        if len(inner) > MAX_TRACE_BYTES:
            raise DumpReadError(f"decompresses to over the {human_bytes(MAX_TRACE_BYTES)} cap")
        held.append(inner)
        del inner
        data, fmt, total = _decode_plain(held)
        return data, f"gzip+{fmt}", total
    return _decode_plain(held)


def _decode_plain(held: list[bytes]) -> tuple[object, str, int]:
    head = held[0][:16]
    if sniff(head) == "json" or head[:1] == b"[":
        data, total = json_stream.decode(held, MAX_ENTRIES)
        return data, "json", total
    if head[:1] != b"\x80":
        raise DumpReadError("neither a pickle nor JSON (unrecognised first byte)")
    return safe_loads(held.pop()), "pickle", 0


def _read_packed(c: Candidate) -> RankTrace | Unreadable:
    """:func:`read_candidate` in a worker: each group membership goes back whole once, then as
    a digest (see :class:`members.MembershipsSent`)."""
    return _SENT.packed(read_candidate(c))


_SENT = MembershipsSent()


def _read_many(jobs: Sequence[Candidate], workers: int) -> list[RankTrace | Unreadable]:
    """Read in forked processes (``workers`` of them at most), each file under a deadline (see
    :mod:`reader_pool`); where this process cannot fork (a training job), the same in a helper
    process (:mod:`reader_helper`), so no file can hold this one. What comes back per rank is a
    few compact arrays (tens of KiB), never the entries themselves; group memberships are shared
    as they arrive."""
    if not jobs:
        return []
    if fork_safe():
        return read_forked(jobs, workers)
    deadline = START_S + sum(deadline_s(job.path) for job in jobs)
    try:
        return call_in_helper(read_forked, (list(jobs), workers), deadline_s=deadline, what=[j.path for j in jobs])
    except HelperUnavailable as error:
        log.warning("no helper process to read %d dump(s) in (%s): reading them in this process, without a "
                    "deadline", len(jobs), error)
        tuples = SharedMemberships()
        return [tuples.trace(read_candidate(job)) for job in jobs]


def read_forked(jobs: Sequence[Candidate], workers: int) -> list[RankTrace | Unreadable]:
    """:func:`_read_many` where forking is safe (here, or in the helper process); in this
    process one file after the other where it is not."""
    tuples = SharedMemberships()
    if not fork_safe():
        return [tuples.trace(read_candidate(job)) for job in jobs]
    processes = max(1, min(workers, len(jobs) // FILES_PER_WORKER))
    chunk = max(1, min(16, len(jobs) // (processes * 8)))
    return [tuples.trace(t) for t in read_isolated(jobs, processes, chunk, _read_packed)]


def default_workers() -> int:
    """Processes for loading: the cores this process may use (capped at 16); 1 where forking
    would be unsafe (torch, CUDA or other threads already live in this process, e.g. inside a
    training job). Small folders are read by one process (see ``FILES_PER_WORKER``)."""
    if not fork_safe():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - linux has it
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def load_folder(path: str | os.PathLike, extra_roots: Sequence[str | os.PathLike] = (),
                workers: int | None = None) -> LoadedFolder:
    """Read every dump under ``path`` (and ``extra_roots``). Raises DumpReadError only when
    ``path`` does not exist; a folder without readable dumps gives an empty ``traces``."""
    roots = [Path(path), *(Path(p) for p in extra_roots)]
    if not os.path.lexists(roots[0]):
        raise DumpReadError(f"{roots[0]}: no such file or folder")
    return _loaded(roots[0], discover(r for r in roots if os.path.lexists(r)), workers)


@dataclass
class ReadInMemory:
    """Files this process wrote from data it holds, as reading them back would give them (path ->
    what :func:`read_candidate`, :func:`read_context`, :func:`read_stacks` return)."""

    traces: dict[str, RankTrace | Unreadable] = field(default_factory=dict)
    contexts: dict[str, tuple[int, RankContext | Unreadable]] = field(default_factory=dict)
    stacks: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)


def load_event(folder: str | os.PathLike, in_memory: ReadInMemory, skip_folders: Sequence[str | os.PathLike],
               read_folders: Sequence[str | os.PathLike] = (), workers: int | None = None) -> LoadedFolder:
    """What :func:`load_folder` gives for ``folder`` once the files under ``skip_folders`` are those
    of ``read_folders`` (read from disk) and of ``in_memory`` (not read again): the two-phase
    gather's summary, without reading back the digests it expanded (49,152 files at 16,384 ranks),
    which may still be on their way to disk."""
    root = Path(folder)
    found = discover([root], skip={Path(f) for f in skip_folders})
    more = discover(Path(f) for f in sorted(read_folders, key=walk_order))
    held = set(in_memory.traces) | set(in_memory.contexts) | set(in_memory.stacks)
    found.traces += [c for c in more.traces if c.path not in held]
    found.contexts += [(f, r) for f, r in more.contexts if str(f) not in held]
    found.stacks += [(f, r) for f, r in more.stacks if str(f) not in held]
    found.ignored += more.ignored
    found.unreadable += more.unreadable
    return _loaded(root, found, workers, in_memory)


def walk_order(path: str | os.PathLike) -> tuple[tuple[str, ...], str]:
    """Where :func:`discover`'s walk meets ``path``: a folder's files before its sub-folders'.
    A plain absolute path (no empty, ``.`` or trailing part) is split as a string, as ``Path``
    would split it (49,152 paths at 16,384 ranks)."""
    if type(path) is str and path.startswith("/") and not _NOT_PLAIN.search(path):
        head, _, name = path.rpartition("/")
        return ("/", *head.split("/")[1:]) if head else ("/",), name
    where = Path(path)
    return where.parent.parts, where.name


_NOT_PLAIN = re.compile(r"//|/\.(/|$)|/$")


def _loaded(root: Path, found: Discovery, workers: int | None, in_memory: ReadInMemory | None = None) -> LoadedFolder:
    memory = in_memory or ReadInMemory()
    context_files = [(str(f), r) for f, r in found.contexts]
    stacks_files = [(str(f), r) for f, r in found.stacks]
    if in_memory is not None:  # in the order a walk of the folder would have met them
        context_files = sorted(context_files + [(p, r) for p, (r, _) in memory.contexts.items()],
                               key=lambda item: walk_order(item[0]))
        stacks_files = sorted(stacks_files + [(p, -1) for p in memory.stacks], key=lambda item: walk_order(item[0]))
    contexts: dict[int, RankContext] = {}
    stacks: dict[int, str] = {}
    activities: dict[int, str] = {}
    unreadable: list[Unreadable] = list(found.unreadable)
    ignored: list[Unreadable] = list(found.ignored)
    for file, rank in context_files:
        held = memory.contexts.get(file)
        if held is not None:
            rank = held[0]
        if rank in contexts:
            continue
        ctx = held[1] if held is not None else read_context(Path(file), rank)
        if isinstance(ctx, Unreadable):
            unreadable.append(ctx)
        else:
            contexts[rank] = ctx
    for file, rank in stacks_files:
        if file in memory.stacks:
            rank = _stacks_rank(file)
            frame, activity = memory.stacks[file]
        else:
            if rank in stacks or rank in activities:
                continue
            frame, activity = read_stacks(Path(file))
        if rank in stacks or rank in activities:
            continue
        if frame:
            stacks[rank] = frame
        if activity:
            activities[rank] = activity
    results = _read_many(found.traces, default_workers() if workers is None else workers)
    if in_memory is not None:
        results = sorted(results + list(memory.traces.values()), key=lambda r: walk_order(r.path))
    ignored.extend(r for r in results if isinstance(r, NotADump))
    unreadable.extend(r for r in results if isinstance(r, Unreadable) and not isinstance(r, NotADump))
    read = _adopt_lone_backend([r for r in results if isinstance(r, RankTrace)])
    traces, duplicates = _dedupe(read)
    warnings = tuple(_rank_disagreements(read, found.traces)) + tuple(_cuts(traces))
    facts = read_collection(root)
    return LoadedFolder(str(root), tuple(traces), contexts, stacks, tuple(unreadable),
                        _locations(traces, contexts, root), facts.gone_ranks, facts.silent_ranks, activities,
                        tuple(Unreadable(u.path, u.why) for u in ignored), tuple(duplicates), warnings,
                        digest_only_ranks=facts.digest_only_ranks, recovery=facts.recovery, refused=facts.refused,
                        gone_exits=facts.gone_exits)


def _stacks_rank(path: str) -> int:
    m = STACKS.match(os.path.basename(path))
    return int(m[1]) if m else -1


NOT_READ_IN_FULL = "not read in full: "
"""How the summary's notes start that say what of a dump was left out (``RankTrace.cut``)."""


def _cuts(traces: list[RankTrace]) -> list[str]:
    """One line per dump the reader did not read in full (past its bounds), at most 20."""
    cut = [t for t in traces if t.cut]
    out = [f"{NOT_READ_IN_FULL}{t.path} (rank {t.rank}): {'; '.join(t.cut)}" for t in cut[:20]]
    if len(cut) > 20:
        out.append(f"{NOT_READ_IN_FULL}{len(cut) - 20} more dumps")
    return out


def _rank_disagreements(read: list[RankTrace], candidates: Sequence[Candidate]) -> list[str]:
    named = {c.path: c for c in candidates}
    out = []
    for t in read:
        c = named.get(t.path)
        if t.rank_from == "content" and c is not None and c.rank is not None and c.rank != t.rank:
            out.append(f"{t.path}: its {c.rank_from} says rank {c.rank} but its content says rank {t.rank}; "
                       f"read as rank {t.rank}")
    return out




def event_folders(root: str | os.PathLike) -> list[Path]:
    """The dump events under ``root``, oldest first. An event is the folders holding our
    ``rank_<R>.context.json`` files that name one event of one run (``ranks/<host>/`` copies belong
    to their event): the folder they share, so an event whose dumps were gathered into per-node
    folders stays one event. ``[root]`` when ``root`` itself holds context files; ``[]`` when
    it holds none (e.g. torch's own dumps)."""
    root = Path(root)
    if not root.is_dir():
        return []
    members: dict[Any, list[Path]] = {}
    newest: dict[Any, float] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        folder = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != "ranks")
        contexts = sorted(f for f in filenames if CONTEXT.match(f))
        if not contexts:
            continue
        if folder == root:
            return [root]
        identity = _event_identity(folder / contexts[0]) or folder
        members.setdefault(identity, []).append(folder)
        newest[identity] = max(newest.get(identity, 0.0), *(_mtime(folder / f) for f in contexts))
    events: dict[Path, float] = {}
    for identity, folders in members.items():
        shared = Path(os.path.commonpath(folders))
        events[shared] = max(events.get(shared, 0.0), newest[identity])
    if root in events:  # events that only share the root: the root is the one folder holding them all
        return [root]
    return sorted(events, key=lambda f: (events[f], str(f)))


def _event_identity(context_path: Path) -> tuple[str, str] | None:
    """(run id, event name) a context file names, or None where it names none (or is not one)."""
    try:
        data = json.loads(read_regular(context_path, MAX_SIDE_FILE_BYTES, "context file"))
    except (DumpReadError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str) or not data["event"]:
        return None
    return str(data.get("run_id") or ""), data["event"][:200]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _adopt_lone_backend(traces: list[RankTrace]) -> list[RankTrace]:
    """A dump without entries names its backend only through its file name, if at all. Where
    every dump with entries is of one backend, an empty one is that backend's: the rank dumped an
    empty buffer (it never entered a collective), which is evidence about it, not a missing dump.
    (A second empty file of the same rank then counts as its duplicate.)"""
    libs = {t.lib for t in traces if t.n_entries > 0}
    if len(libs) != 1:
        return traces
    lib = next(iter(libs))
    return [replace(t, lib=lib) if t.n_entries == 0 and t.lib != lib else t for t in traces]


def _dedupe(traces: list[RankTrace]) -> tuple[list[RankTrace], list[Duplicate]]:
    """One dump per (rank, backend): the one whose entries are newest (then the longer one)."""
    best: dict[tuple[int, str], RankTrace] = {}
    duplicates = []
    for t in sorted(traces, key=lambda t: t.path):
        key = (t.rank, t.lib)
        old = best.get(key)
        if old is None:
            best[key] = t
            continue
        keep, drop = (t, old) if (t.newest_ns, t.n_entries) > (old.newest_ns, old.n_entries) else (old, t)
        best[key] = keep
        duplicates.append(Duplicate(t.rank, t.lib, keep.path, drop.path))
    kept = {t.path for t in best.values()}
    duplicates = [d if d.kept in kept else replace(d, kept=best[(d.rank, d.backend)].path) for d in duplicates]
    return sorted(best.values(), key=lambda t: (t.rank, t.lib)), duplicates


def read_context(path: Path, rank: int) -> RankContext | Unreadable:
    try:
        data = json.loads(read_regular(path, MAX_SIDE_FILE_BYTES, "context file"))
    except DumpReadError as exc:
        return Unreadable(str(path), str(exc))
    except (ValueError, RecursionError) as exc:
        return Unreadable(str(path), f"context file is not valid JSON ({str(exc)[:80]})")
    return context_from_data(data, str(path), rank)


def context_from_data(data: Any, path: str, rank: int) -> RankContext | Unreadable:
    """A decoded ``context.json`` as :func:`read_context` reads it."""
    if not isinstance(data, dict):
        return Unreadable(path, "context file is not a JSON object")

    def _int(key: str) -> int | None:
        v = data.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62 else None

    def _str(key: str) -> str | None:
        v = data.get(key)
        return str(v)[:1000] if isinstance(v, (str, int, float)) else None

    def _seconds(key: str) -> float | None:
        v = data.get(key)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e12  # NaN fails both
        return float(v) if ok else None

    return RankContext(rank=rank, path=path, host=_str("host"), world_size=_int("world_size"),
                       pg_config=parse_pg_config(data.get("pg_config")), phase=_str("phase"),
                       step=_int("step"), reason=_str("reason"), event=_str("event"),
                       exception=_str("exception"), initiator_rank=_int("initiator_rank"),
                       p2p_in_flight=p2p_from_context(data.get("p2p_in_flight")),
                       seconds_since_heartbeat=_seconds("seconds_since_heartbeat"), time_unix=_seconds("time_unix"),
                       stall_threshold_seconds=_seconds("stall_threshold_seconds"))


def read_stacks(path: Path) -> tuple[str | None, str | None]:
    """(the main thread's innermost user frame, what library code it waits in if known)."""
    try:
        text = read_regular(path, MAX_SIDE_FILE_BYTES, "stacks file").decode("utf-8", errors="replace")
    except DumpReadError:
        return None, None
    return stacks_from_text(text)


def stacks_from_text(text: str) -> tuple[str | None, str | None]:
    return main_thread_user_frame(text), main_thread_activity(text)


def trace_from_data(data: dict[str, Any], path: str, rank: int, listed: bool) -> RankTrace | Unreadable:
    """A decoded pickle dump named ``rank_<R>.<lib>.fr.pkl`` at ``path``, as :func:`read_candidate`
    reads that file (``listed``: in the ``trace_files`` of rank ``rank``'s context file beside it)."""
    from lightning_ncclx.analysis.discover import OURS

    ours = OURS.match(os.path.basename(path))
    candidate = Candidate(path, rank, "context" if listed else "layout", ours[2] if ours else "", "", True)
    return _with_rank(build_trace(data, rank, path, candidate.lib_hint, 0), candidate, data, "pickle")


def host_of(path: str, root: Path) -> str | None:
    """``ranks/<host>/...`` in a path names the host that wrote it."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "ranks" and i + 1 < len(parts) - 1:
            return parts[i + 1]
    return None


def _locations(traces: list[RankTrace], contexts: dict[int, RankContext], root: Path) -> dict[str, tuple[str, ...]]:
    where: dict[str, set[str]] = {}
    folders: dict[str, tuple[str, str | None]] = {}  # the files of a folder share both: worked out once per folder
    for t in traces:
        folder = os.path.dirname(t.path)
        if folder not in folders:
            folders[folder] = (str(Path(t.path).parent), host_of(t.path, root))
        parent, host_in_path = folders[folder]
        ctx = contexts.get(t.rank)
        host = (ctx.host if ctx else None) or host_in_path or "local"
        where.setdefault(host, set()).add(parent)
    return {h: tuple(sorted(p)) for h, p in where.items()}
