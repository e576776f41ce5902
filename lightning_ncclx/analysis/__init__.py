"""Diagnose a distributed hang from flight-recorder dumps: load (the only I/O) -> align by
collective sequence id -> diagnose -> :class:`Summary`. Imports neither torch nor Lightning.

Example::

    from lightning_ncclx.analysis import analyze_folder, Verdict
    summary = analyze_folder("ncclx_dumps/stall-001")
    print(summary.verdict, summary.culprit_ranks, summary.headline)
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from lightning_ncclx.analysis.diagnose import analyze
    from lightning_ncclx.analysis.load import load_folder
    from lightning_ncclx.analysis.model import (SCHEMA, CulpritState, Finding, GroupRef, RankRow, Straggler, Summary,
                                                Unreadable, Verdict)

__all__ = ["SCHEMA", "CulpritState", "Finding", "GroupRef", "RankRow", "Straggler", "Summary", "Unreadable",
           "Verdict", "analyze", "analyze_folder", "load_folder"]

_HOME = {"analyze": "diagnose", "load_folder": "load", **{name: "model" for name in (
    "SCHEMA", "CulpritState", "Finding", "GroupRef", "RankRow", "Straggler", "Summary", "Unreadable", "Verdict")}}
"""Where each name lives. Loaded on first use, so that importing one small module of this
package (``safe_pickle``, by the dump writer on every rank) does not load the whole analyzer."""


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def analyze_folder(path: str | os.PathLike, *, extra_roots: Sequence[str | os.PathLike] = (),
                   workers: int | None = None) -> "Summary":
    """Read every dump under ``path`` (and ``extra_roots``, e.g. torch's own dump folder) and
    diagnose. Raises :class:`~lightning_ncclx.errors.DumpReadError` when ``path`` does not exist;
    unreadable files are listed in ``Summary.unreadable``. ``workers``: processes for loading
    (default: all cores when it is safe to fork, else 1)."""
    import gc
    import threading

    from lightning_ncclx.analysis.diagnose import analyze
    from lightning_ncclx.analysis.load import load_folder

    # 16,384 ranks' compact traces are ~10^6 acyclic objects: each full collection would walk them
    # all. Paused only where nothing else runs (never inside a training job's process).
    pause = gc.isenabled() and threading.active_count() == 1
    if pause:
        gc.disable()
    try:
        return analyze(load_folder(path, extra_roots, workers=workers))
    finally:
        if pause:
            gc.enable()
