"""The two-phase gather's first diagnosis, made from the digests as they are expanded, and the
summary's reading of the event folder after the full dumps arrived.

The expansion writes three files per rank (49,152 at 16,384 ranks); this keeps what reading each
back would give (the analyzer's own readers, run on the same data: :class:`ReadInMemory`), so that
neither the first diagnosis nor the summary reads them back. The summary reads from disk the
folder's own dumps and the host folders the full dumps were unpacked into; ``lightning-ncclx
summarize`` on the folder reads every file and says the same.

Example::

    first = FirstDiagnosis(folder)          # before anything is written under folder/ranks/
    first.add(expanded, host)               # each digest, as it is expanded
    summary = first.run(gone=[], silent={}, digest_only=[3, 4])
    loaded = first.final_loaded(digest_only=[3], read_folders=[folder / "ranks" / "node-1"])
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from lightning_ncclx.dump.digest_expand import Expanded
from lightning_ncclx.layout import CONTEXT_SUFFIX, GATHERED_FOLDER, INCOMING_FOLDER, STACKS_SUFFIX, rank_file

log = logging.getLogger(__name__)


class FirstDiagnosis:
    """The loaded view of an event folder plus the digests added to it."""

    def __init__(self, folder: Path) -> None:
        from lightning_ncclx.analysis.load import ReadInMemory, load_folder

        self.folder = folder
        self.loaded = load_folder(folder)
        self.memory = ReadInMemory()
        self._rank_of: dict[str, int] = {}
        self._host_folders: dict[str, str] = {}
        self._have = {t.rank for t in self.loaded.traces} | set(self.loaded.contexts)

    def add(self, expanded: Expanded, host: str) -> None:
        """One rank's expanded digest, as its files under ``ranks/<host>/`` will read."""
        from lightning_ncclx.analysis.load import context_from_data, stacks_from_text, trace_from_data

        rank = expanded.rank
        if rank in self._have:
            return
        where = self._host_folders.get(host)
        if where is None:  # one Path per host; the files' paths by joining strings
            where = self._host_folders[host] = str(self.folder / GATHERED_FOLDER / host) + os.sep
        listed = expanded.context.get("trace_files") or ()
        for name, trace in expanded.traces.items():
            path = where + name
            self.memory.traces[path] = trace_from_data(trace, path, rank, name in listed)
            self._rank_of[path] = rank
        path = where + rank_file(rank, CONTEXT_SUFFIX)
        self.memory.contexts[path] = (rank, context_from_data(expanded.context, path, rank))
        if expanded.stacks is not None:
            path = where + rank_file(rank, STACKS_SUFFIX)
            self.memory.stacks[path] = stacks_from_text(expanded.stacks)
            self._rank_of[path] = rank

    def run(self, gone: list[int], silent: dict[int, dict], digest_only: list[int]) -> Any:
        """The analyzer's ``Summary`` of the folder's dumps and the digests added, for its findings
        (no per-rank rows or straggler statistics: the reports come from the summary after the
        full dumps)."""
        from lightning_ncclx.analysis import analyze
        from lightning_ncclx.analysis.model import RankContext, RankTrace

        loaded = self.loaded
        added = [t for t in self.memory.traces.values() if isinstance(t, RankTrace)]
        traces = sorted(list(loaded.traces) + added, key=lambda t: (t.rank, t.lib))
        contexts = {r: c for r, c in self.memory.contexts.values() if isinstance(c, RankContext)}
        stacks: dict[int, str] = {}
        activities: dict[int, str] = {}
        for path, (frame, activity) in self.memory.stacks.items():
            if frame:
                stacks[self._rank_of[path]] = frame
            if activity:
                activities[self._rank_of[path]] = activity
        loaded = replace(loaded, traces=tuple(traces), contexts={**loaded.contexts, **contexts},
                         stacks={**loaded.stacks, **stacks}, activities={**loaded.activities, **activities},
                         gone_ranks=tuple(gone), silent_ranks=silent, digest_only_ranks=tuple(digest_only))
        return analyze(loaded, for_reports=False)  # read for its findings only

    def final_loaded(self, digest_only: Sequence[int], read_folders: Sequence[Path]) -> Any:
        """The event folder as :func:`~lightning_ncclx.analysis.load.load_folder` reads it once
        ``collection.json`` is written: the files of the ``digest_only`` ranks from memory, those
        under ``read_folders`` (where full dumps were unpacked, over their digests) and the folder's
        own from disk."""
        from lightning_ncclx.analysis.load import ReadInMemory, load_event

        keep = set(digest_only)
        memory = ReadInMemory(
            traces={p: t for p, t in self.memory.traces.items() if self._rank_of[p] in keep},
            contexts={p: held for p, held in self.memory.contexts.items() if held[0] in keep},
            stacks={p: s for p, s in self.memory.stacks.items() if self._rank_of[p] in keep})
        return load_event(self.folder, memory, (self.folder / GATHERED_FOLDER, self.folder / INCOMING_FOLDER),
                          read_folders)
