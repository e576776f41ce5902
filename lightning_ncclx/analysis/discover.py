"""Find the dump files under a folder by their content, and the rank each one belongs to.

Walk (at most :data:`MAX_DEPTH` folders deep, regular files only, symlinks only when they stay
inside the folder, each real folder once) -> sniff each file's first bytes (pickle, JSON, gzip)
-> a rank per file, by the first rule that gives one:

1. this plugin's layout: ``rank_<R>.<backend>.fr.pkl|json``, or a file a ``rank_<R>.context.json``
   lists in its ``trace_files``;
2. a number in the file name: ``rank_3.pkl``, ``rank3.json``, ``trace-rank-5.pickle``,
   ``nccl_trace_rank_12``, ``trace_3.json`` (``rank`` followed by digits, else trailing digits);
3. the nearest folder named like a rank: ``gathered/host7/rank_3/fr.pkl`` (``rank_3``, ``rank3``, ``3``).

A rank the dump's content states is preferred when present (see :mod:`parse`); the loader warns
when it disagrees with the name. Pure except for ``os`` reads; never raises for bad files.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Iterable, Iterator

from lightning_ncclx.analysis.model import Unreadable
from lightning_ncclx.analysis.parse import MAX_RANK
from lightning_ncclx.analysis.safe_read import (MAX_SIDE_FILE_BYTES, MAX_TOTAL_BYTES, MAX_TRACE_BYTES, SNIFF_BYTES,
                                                file_kind, human_bytes, read_regular)
from lightning_ncclx.errors import DumpReadError
from lightning_ncclx.layout import is_plugin_side_file

MAX_DEPTH = 6
MAX_FILES = 200_000
"""Files looked at under one folder; beyond this the walk stops and says so."""

OURS = re.compile(r"^rank_(\d{1,9})\.([A-Za-z0-9_+-]{1,40}(?:\.[A-Za-z0-9_+-]{1,40})?)\.fr\.(pkl|json)$")
CONTEXT = re.compile(r"^rank_(\d{1,9})\.context\.json$")
STACKS = re.compile(r"^rank_(\d{1,9})\.stacks\.txt$")
_RANK_WORD = re.compile(r"rank[_.-]?(\d{1,12})(?!\d)", re.IGNORECASE)
_TRAILING = re.compile(r"(?<!\d)(\d{1,12})$")
_FOLDER = re.compile(r"^(?:rank[_.-]?)?(\d{1,12})$", re.IGNORECASE)
_EXTENSIONS = (".gz", ".pkl", ".pickle", ".json", ".fr", ".bin", ".dump", ".trace", ".pt")


@dataclass(frozen=True)
class Candidate:
    """A file whose first bytes say pickle, JSON or gzip: maybe a dump."""

    path: str
    rank: int | None
    rank_from: str
    """``layout``, ``context``, ``file name``, ``folder name`` or ``""`` (none: content must say)."""
    lib_hint: str
    fmt: str
    """``pickle``, ``json`` or ``gzip``; ``""`` when not sniffed yet (a file named like a dump is
    sniffed by its reader, :func:`refusal` then says why it is not read)."""
    named_like_dump: bool
    """Its name carries a rank: a file that then fails to parse is unreadable, not ignored."""
    explicit: bool = False
    """Named on the command line: read whatever its name, rank 0 when nothing states one."""


@dataclass
class Discovery:
    traces: list[Candidate] = field(default_factory=list)
    contexts: list[tuple[Path, int]] = field(default_factory=list)
    stacks: list[tuple[Path, int]] = field(default_factory=list)
    ignored: list[Unreadable] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)


def rank_from_name(name: str) -> int | None:
    """The rank a file name states: ``rank`` + digits (the last one), else trailing digits of
    the name without its dump extensions; None when there is no number."""
    stem = name
    lowered = stem.lower()
    stripped = True
    while stripped:
        stripped = False
        for ext in _EXTENSIONS:
            if lowered.endswith(ext) and len(lowered) > len(ext):
                stem, lowered, stripped = stem[:-len(ext)], lowered[:-len(ext)], True
    words = _RANK_WORD.findall(stem)
    if words:
        return int(words[-1])
    m = _TRAILING.search(stem)
    return int(m[1]) if m else None


def rank_from_folders(path: Path, root: Path) -> int | None:
    """The nearest folder between ``path`` and ``root`` (inclusive) named like a rank."""
    for parent in path.parents:
        m = _FOLDER.match(parent.name)
        if m:
            return int(m[1])
        if parent == root or parent == parent.parent:
            break
    return None


ZSTD = "zstd-compressed: decompress it first (zstd -d), then rerun"
UNRECOGNISED = "neither a pickle nor JSON (unrecognised first byte)"


def refusal(head: bytes) -> tuple[bool, str] | None:
    """Why a file named like a dump, whose first bytes are ``head``, is not read: (ignored?,
    why); None when they say pickle, JSON or gzip."""
    fmt = sniff(head)
    if fmt == "zstd":
        return True, ZSTD
    return (False, UNRECOGNISED) if fmt is None else None


def sniff(head: bytes) -> str | None:
    """``pickle``, ``json``, ``gzip``, ``zstd`` or None from a file's first bytes."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if text.startswith(b"{"):
        return "json"
    return None


def walk(roots: Iterable[Path], ignored: list[Unreadable],
         skip: Collection[Path] = ()) -> Iterator[tuple[Path, Path, os.stat_result]]:
    """(root, file, stat) for every regular file under ``roots`` but the folders ``skip``; what is
    skipped and why goes to ``ignored``. Each real folder and file is visited once even when
    roots overlap."""
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: set[tuple[int, int]] = set()
    count = 0
    for root in roots:
        try:
            st = os.stat(root)
        except OSError as exc:
            ignored.append(Unreadable(str(root), f"cannot read: {exc.strerror or exc}"))
            continue
        if not stat.S_ISDIR(st.st_mode):
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen_files:
                seen_files.add((st.st_dev, st.st_ino))
                yield root, root, st
            elif not stat.S_ISREG(st.st_mode):
                ignored.append(Unreadable(str(root), f"{file_kind(st.st_mode)}, not a regular file: not read"))
            continue
        real_root = os.path.realpath(root)
        stack: list[tuple[Path, int]] = [(root, 0)]
        seen_dirs.add((st.st_dev, st.st_ino))
        while stack:
            folder, depth = stack.pop()
            try:
                with os.scandir(folder) as listing:
                    entries = sorted(listing, key=lambda e: e.name)
            except OSError as exc:
                ignored.append(Unreadable(str(folder), f"cannot list folder: {exc.strerror or exc}"))
                continue
            subdirs = []
            for entry in entries:
                count += 1
                if count > MAX_FILES:
                    ignored.append(Unreadable(str(folder), f"stopped after {MAX_FILES} files: pass a sub-folder"))
                    return
                path = Path(entry.path)
                try:
                    if entry.is_symlink():
                        target = os.path.realpath(entry.path)
                        if target != real_root and not target.startswith(real_root.rstrip(os.sep) + os.sep):
                            ignored.append(Unreadable(str(path), f"a symlink out of the folder (to {target}): not "
                                                                 "followed"))
                            continue
                        est = os.stat(entry.path)
                    else:
                        est = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    ignored.append(Unreadable(str(path), f"cannot read: {exc.strerror or exc}"))
                    continue
                key = (est.st_dev, est.st_ino)
                if stat.S_ISDIR(est.st_mode):
                    if path in skip:
                        continue
                    if key in seen_dirs:
                        continue  # a symlink loop, or a folder reached twice
                    seen_dirs.add(key)
                    if depth + 1 > MAX_DEPTH:
                        ignored.append(Unreadable(str(path), f"deeper than {MAX_DEPTH} folders: not searched"))
                        continue
                    subdirs.append((path, depth + 1))
                elif stat.S_ISREG(est.st_mode):
                    if key not in seen_files:
                        seen_files.add(key)
                        yield root, path, est
                else:
                    ignored.append(Unreadable(str(path), f"{file_kind(est.st_mode)}, not a regular file: not read"))
            stack.extend(reversed(subdirs))


def discover(roots: Iterable[Path], skip: Collection[Path] = ()) -> Discovery:
    """Candidates, context and stacks files, and what was skipped, under ``roots`` (but the
    folders ``skip``)."""
    roots = list(roots)
    found = Discovery()
    by_context: dict[tuple[str, str], int] = {}  # (folder, file name) -> rank, from context files
    files = list(walk(roots, found.ignored, skip))
    for _, path, _ in files:  # context files first: they name their traces
        m = CONTEXT.match(path.name)
        if m:
            found.contexts.append((path, int(m[1])))
            _listed_by_contexts(path, int(m[1]), by_context)
    total = 0
    for root, path, st in files:
        name = path.name
        if CONTEXT.match(name):
            continue
        m = STACKS.match(name)
        if m:
            found.stacks.append((path, int(m[1])))
            continue
        if is_plugin_side_file(name):
            continue
        candidate = _candidate(root, path, st, by_context, found, explicit=path == root)
        if candidate is None:
            continue
        total += st.st_size
        if total > MAX_TOTAL_BYTES:
            found.ignored.append(Unreadable(str(path), f"over the {human_bytes(MAX_TOTAL_BYTES)} cap on all dumps "
                                                       "of one folder: analyze a sub-folder"))
            continue
        found.traces.append(candidate)
    return found


def _listed_by_contexts(path: Path, rank: int, out: dict[tuple[str, str], int]) -> None:
    try:
        data = json.loads(read_regular(path, MAX_SIDE_FILE_BYTES, "context file"))
    except (DumpReadError, ValueError, RecursionError):
        return
    files = data.get("trace_files") if isinstance(data, dict) else None
    for name in files if isinstance(files, list) else ():
        if isinstance(name, str):
            out[(str(path.parent), name)] = rank


def _candidate(root: Path, path: Path, st: os.stat_result, by_context: dict[tuple[str, str], int],
               found: Discovery, explicit: bool) -> Candidate | None:
    name = path.name
    ours = OURS.match(name)
    rank, rank_from, hint = None, "", ""
    if (str(path.parent), name) in by_context:
        rank, rank_from = by_context[(str(path.parent), name)], "context"
        hint = ours[2] if ours else ""
    elif ours:
        rank, rank_from, hint = int(ours[1]), "layout", ours[2]
    elif (rank := rank_from_name(name)) is not None:
        rank_from = "file name"
    elif (rank := rank_from_folders(path, root)) is not None:
        rank_from = "folder name"
    named = rank_from in ("context", "layout", "file name") or explicit
    if rank is not None and rank >= MAX_RANK:
        found.unreadable.append(Unreadable(str(path), f"rank {rank} from its {rank_from} is not believable (at most "
                                                      f"{MAX_RANK - 1}): rename it rank_<N>.<ext>"))
        return None
    if st.st_size > MAX_TRACE_BYTES:
        found.ignored.append(Unreadable(str(path), f"{human_bytes(st.st_size)}, over the "
                                                   f"{human_bytes(MAX_TRACE_BYTES)} cap for one dump"))
        return None
    if st.st_size == 0:
        (found.unreadable if named else found.ignored).append(Unreadable(str(path), "empty file"))
        return None
    if named:  # read anyway: its reader sniffs it (16,384 files: 16,384 opens fewer here)
        return Candidate(str(path), rank, rank_from, hint, "", named, explicit)
    try:
        head = read_regular(path, MAX_TRACE_BYTES, "file", limit=SNIFF_BYTES)
    except DumpReadError as exc:
        found.ignored.append(Unreadable(str(path), str(exc)))
        return None
    fmt = sniff(head)
    if fmt == "zstd":
        found.ignored.append(Unreadable(str(path), ZSTD))
        return None
    if fmt is None:
        found.ignored.append(Unreadable(str(path), "not a dump (neither a pickle, JSON nor gzip)"))
        return None
    return Candidate(str(path), rank, rank_from, hint, fmt, named, explicit)
