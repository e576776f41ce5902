"""The two-phase gather's first diagnosis, made from the digests as they are expanded.

It only picks whose full dumps to ask for (the final summary reads every file, as ``lightning-ncclx
summarize`` would), so it skips reading back the three files per rank that the expansion has just
written (49,152 at 16,384 ranks): the analyzer's own parser and diagnosis (``build_trace``,
``analyze``) run on what those files hold; the dumps already in the event folder (this rank's own,
and any other rank's on a shared disk) are loaded from it as usual.

Example::

    first = FirstDiagnosis(folder)          # before anything is written under folder/ranks/
    first.add(expanded)                     # each digest, as it is expanded
    summary = first.run(gone=[], silent={}, digest_only=[3, 4])
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightning_ncclx.dump.digest_expand import Expanded
from lightning_ncclx.layout import GATHERED_FOLDER

log = logging.getLogger(__name__)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62 else None


def _str(value: Any) -> str | None:
    return str(value)[:1000] if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


class FirstDiagnosis:
    """The loaded view of an event folder plus the digests added to it."""

    def __init__(self, folder: Path) -> None:
        from lightning_ncclx.analysis.load import load_folder

        self.folder = folder
        self.loaded = load_folder(folder)
        self._traces: list[Any] = []
        self._contexts: dict[int, Any] = {}
        self._stacks: dict[int, str] = {}
        self._activities: dict[int, str] = {}
        self._have = {t.rank for t in self.loaded.traces} | set(self.loaded.contexts)

    def add(self, expanded: Expanded, host: str) -> None:
        """One rank's expanded digest, as its files under ``ranks/<host>/`` will read."""
        from lightning_ncclx.analysis.frames import main_thread_activity, main_thread_user_frame
        from lightning_ncclx.analysis.model import RankContext
        from lightning_ncclx.analysis.parse import build_trace

        rank = expanded.rank
        if rank in self._have:
            return
        where = self.folder / GATHERED_FOLDER / host
        for name, trace in expanded.traces.items():
            lib = name.split(".")[1] if name.count(".") >= 3 else ""
            built = build_trace(trace, rank, str(where / name), lib)
            self._traces.append(replace(built, rank=rank, rank_from="layout", fmt="pickle"))
        ctx = expanded.context
        self._contexts[rank] = RankContext(
            rank=rank, path=str(where / f"rank_{rank:05d}.context.json"), host=_str(ctx.get("host")),
            world_size=_int(ctx.get("world_size")), phase=_str(ctx.get("phase")), step=_int(ctx.get("step")),
            reason=_str(ctx.get("reason")), event=_str(ctx.get("event")), exception=_str(ctx.get("exception")),
            initiator_rank=_int(ctx.get("initiator_rank")))
        if expanded.stacks is not None:
            frame, activity = main_thread_user_frame(expanded.stacks), main_thread_activity(expanded.stacks)
            if frame:
                self._stacks[rank] = frame
            if activity:
                self._activities[rank] = activity

    def run(self, gone: list[int], silent: dict[int, dict], digest_only: list[int]) -> Any:
        """The analyzer's ``Summary`` of the folder's dumps and the digests added."""
        from lightning_ncclx.analysis import analyze

        loaded = self.loaded
        traces = sorted(list(loaded.traces) + self._traces, key=lambda t: (t.rank, t.lib))
        loaded = replace(loaded, traces=tuple(traces), contexts={**loaded.contexts, **self._contexts},
                         stacks={**loaded.stacks, **self._stacks}, activities={**loaded.activities, **self._activities},
                         gone_ranks=tuple(gone), silent_ranks=silent, digest_only_ranks=tuple(digest_only))
        return analyze(loaded)
