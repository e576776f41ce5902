"""The only I/O stage: find dump files under one or more roots, read them safely, compact them.

Recognised names (searched recursively):

* ours: ``rank_<R>.<backend>.fr.pkl|json``, ``rank_<R>.context.json``, ``rank_<R>.stacks.txt``
  (also under ``ranks/<host>/``);
* torch's own and anything else: ``<prefix><R>`` with optional ``.pkl``/``.pickle``/``.json``.

Everything else (``summary.*``, READMEs, logs) is ignored. A file that looks like a dump but is
not one lands in ``unreadable`` with the reason; the same rank and backend found twice keeps the
newest dump.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

from lightning_ncclx.analysis.frames import main_thread_activity, main_thread_user_frame
from lightning_ncclx.analysis.model import LoadedFolder, RankContext, RankTrace, Unreadable
from lightning_ncclx.analysis.parse import build_trace, parse_pg_config
from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.errors import DumpReadError

_OURS = re.compile(r"^rank_(\d+)\.(.+)\.fr\.(pkl|json)$")
_CONTEXT = re.compile(r"^rank_(\d+)\.context\.json$")
_STACKS = re.compile(r"^rank_(\d+)\.stacks\.txt$")
_FOREIGN = re.compile(r"^(.*?)(\d+)(\.pkl|\.pickle|\.json)?$")
MAX_DUMP_BYTES = 2 << 30
FILES_PER_WORKER = 12  # below this many files per process, forking costs more than it saves
MAX_WORKERS = 16


def classify(name: str) -> tuple[str, int, str] | None:
    """(kind, rank, backend hint) for a file name, or None when it is not ours to read."""
    if name.startswith((".", "summary.")) or name.endswith((".tmp", ".partial")):
        return None
    for kind, pattern in (("context", _CONTEXT), ("stacks", _STACKS)):
        m = pattern.match(name)
        if m:
            return kind, int(m[1]), ""
    m = _OURS.match(name)
    if m:
        return "trace", int(m[1]), m[2]
    m = _FOREIGN.match(name)
    if m and not name.startswith("rank_"):
        return "trace", int(m[2]), ""
    return None


def read_trace_file(path: str, rank: int, lib_hint: str = "") -> RankTrace | Unreadable:
    """Read and compact one dump; never raises for bad input (returns :class:`Unreadable`)."""
    was_enabled = gc.isenabled()
    gc.disable()  # a dump is thousands of acyclic containers: the collector only costs time here
    try:
        size = os.path.getsize(path)
        if size == 0:
            return Unreadable(path, "empty file")
        if size > MAX_DUMP_BYTES:
            return Unreadable(path, f"too large for a flight-recorder dump ({size} bytes)")
        with open(path, "rb") as fh:
            raw = fh.read()
        return build_trace(_decode(raw), rank, path, lib_hint)
    except DumpReadError as exc:
        return Unreadable(path, str(exc))
    except OSError as exc:
        return Unreadable(path, f"cannot read: {exc.strerror or exc}")
    finally:
        if was_enabled:
            gc.enable()


def _decode(raw: bytes) -> object:
    head = raw[:1]
    if head in (b"{", b"[") or raw[:3] == b"\xef\xbb\xbf":
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise DumpReadError(f"not valid JSON ({str(exc)[:80]})") from None
    if head != b"\x80":
        raise DumpReadError("neither a pickle nor JSON (unrecognised first byte)")
    return safe_loads(raw)


def _read_many(jobs: Sequence[tuple[str, int, str]], workers: int) -> list[RankTrace | Unreadable]:
    """Read in ``workers`` forked processes. What comes back per rank is a few compact arrays
    (tens of KiB), never the entries themselves."""
    workers = min(workers, len(jobs) // FILES_PER_WORKER)
    if workers <= 1:
        return [read_trace_file(*job) for job in jobs]
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        chunk = max(1, min(16, len(jobs) // (workers * 8)))
        return list(pool.map(read_trace_file, *zip(*jobs), chunksize=chunk))


def default_workers() -> int:
    """Processes for loading: the cores this process may use (capped at 16), but none when
    forking would be unsafe (torch, CUDA or other threads already live in this process, e.g.
    inside a training job). Small folders are read in-process (see ``FILES_PER_WORKER``)."""
    import threading

    if sys.platform != "linux" or "torch" in sys.modules or threading.active_count() > 1:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - linux has it
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def walk_files(roots: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        if root.is_file():
            out.append(root)
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            out.extend(Path(dirpath, f) for f in sorted(filenames))
    return out


def load_folder(path: str | os.PathLike, extra_roots: Sequence[str | os.PathLike] = (),
                workers: int | None = None) -> LoadedFolder:
    """Read every dump under ``path`` (and ``extra_roots``). Raises DumpReadError only when
    ``path`` does not exist; a folder without readable dumps gives an empty ``traces``."""
    roots = [Path(path), *(Path(p) for p in extra_roots)]
    if not roots[0].exists():
        raise DumpReadError(f"{roots[0]}: no such file or folder")
    jobs: list[tuple[str, int, str]] = []
    contexts: dict[int, RankContext] = {}
    stacks: dict[int, str] = {}
    activities: dict[int, str] = {}
    unreadable: list[Unreadable] = []
    for file in walk_files(r for r in roots if r.exists()):
        kind = classify(file.name)
        if kind is None and file in roots:
            kind = ("trace", 0, "")  # a file named explicitly is read whatever its name; rank 0
        if kind is None:
            continue
        what, rank, hint = kind
        if what == "trace":
            jobs.append((str(file), rank, hint))
        elif what == "context" and rank not in contexts:
            ctx = read_context(file, rank)
            if isinstance(ctx, Unreadable):
                unreadable.append(ctx)
            else:
                contexts[rank] = ctx
        elif what == "stacks" and rank not in stacks:
            frame, activity = read_stacks(file)
            if frame:
                stacks[rank] = frame
            if activity:
                activities[rank] = activity
    results = _read_many(jobs, default_workers() if workers is None else workers)
    traces = _dedupe([r for r in results if isinstance(r, RankTrace)])
    unreadable.extend(r for r in results if isinstance(r, Unreadable))
    gone, silent = read_collection(roots[0])
    return LoadedFolder(str(roots[0]), tuple(traces), contexts, stacks, tuple(unreadable),
                        _locations(traces, contexts, roots[0]), gone, silent, activities)


COLLECTION_FILE = "collection.json"


def event_folders(root: str | os.PathLike) -> list[Path]:
    """The dump events under ``root``, oldest first: folders that directly hold our
    ``rank_<R>.context.json`` files (``ranks/<host>/`` copies belong to their event). ``[root]``
    when ``root`` is itself one event; ``[]`` when it holds no context file (e.g. torch's own
    dumps)."""
    root = Path(root)
    if not root.is_dir():
        return []
    newest: dict[Path, float] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        folder = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != "ranks")
        times = [_mtime(folder / f) for f in filenames if _CONTEXT.match(f)]
        if times:
            newest[folder] = max(times)
            if folder == root:
                return [root]
    return sorted(newest, key=lambda f: (newest[f], str(f)))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def read_collection(root: Path) -> tuple[tuple[int, ...], dict[int, dict]]:
    """What the watchdog knew about the ranks without a dump when it collected this event
    (``collection.json``): ranks whose process had exited, and ranks alive but silent
    (rank -> ``{"pid", "host", "state"}``). Empty without that file or when it does not parse."""
    path = root / COLLECTION_FILE
    try:
        data = json.loads(path.read_bytes()) if path.is_file() else {}
    except (OSError, ValueError):
        return (), {}
    if not isinstance(data, dict):
        return (), {}
    gone_raw = data.get("gone_ranks")
    gone = tuple(sorted({r for r in gone_raw if isinstance(r, int) and not isinstance(r, bool) and r >= 0})) \
        if isinstance(gone_raw, list) else ()
    silent: dict[int, dict] = {}
    silent_raw = data.get("silent_ranks")
    for key, proc in (silent_raw.items() if isinstance(silent_raw, dict) else ()):
        if str(key).isdigit() and isinstance(proc, dict):
            silent[int(key)] = {k: proc.get(k) for k in ("pid", "host", "state")}
    return gone, silent


def _dedupe(traces: list[RankTrace]) -> list[RankTrace]:
    best: dict[tuple[int, str], RankTrace] = {}
    for t in traces:
        key = (t.rank, t.lib)
        old = best.get(key)
        if old is None or (t.newest_ns, t.n_entries) > (old.newest_ns, old.n_entries):
            best[key] = t
    return sorted(best.values(), key=lambda t: (t.rank, t.lib))


def read_context(path: Path, rank: int) -> RankContext | Unreadable:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        return Unreadable(str(path), f"context file is not valid JSON ({str(exc)[:80]})")
    if not isinstance(data, dict):
        return Unreadable(str(path), "context file is not a JSON object")

    def _int(key: str) -> int | None:
        v = data.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def _str(key: str) -> str | None:
        v = data.get(key)
        return str(v) if v is not None else None

    return RankContext(rank=rank, path=str(path), host=_str("host"), world_size=_int("world_size"),
                       pg_config=parse_pg_config(data.get("pg_config")), phase=_str("phase"),
                       step=_int("step"), reason=_str("reason"), event=_str("event"),
                       exception=_str("exception"), initiator_rank=_int("initiator_rank"))


def read_stacks(path: Path) -> tuple[str | None, str | None]:
    """(the main thread's innermost user frame, what library code it waits in if known)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, None
    return main_thread_user_frame(text), main_thread_activity(text)


def host_of(path: str, root: Path) -> str | None:
    """``ranks/<host>/...`` in a path names the host that wrote it."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "ranks" and i + 1 < len(parts) - 1:
            return parts[i + 1]
    return None


def _locations(traces: list[RankTrace], contexts: dict[int, RankContext], root: Path) -> dict[str, tuple[str, ...]]:
    where: dict[str, set[str]] = {}
    for t in traces:
        ctx = contexts.get(t.rank)
        host = (ctx.host if ctx else None) or host_of(t.path, root) or "local"
        where.setdefault(host, set()).add(str(Path(t.path).parent))
    return {h: tuple(sorted(p)) for h, p in where.items()}
