"""The on-disk contract of a dump folder, in one place: what the writer names each file, what
the gatherer copies and what the loader looks for first. Format: ``docs/dump-format.md``.

Example::

    rank_file(3, "gloo.fr.pkl")   # "rank_00003.gloo.fr.pkl"
"""

from __future__ import annotations

import os
from pathlib import Path

RANK_PREFIX = "rank_"
COLLECTION_FILE = "collection.json"
"""What the initiator knows about an event: who dumped, who is missing, gone or silent."""
GATHERED_FOLDER = "ranks"
"""``<event>/ranks/<host>/``: dumps pulled through the store from other hosts."""
INCOMING_FOLDER = ".incoming"
"""Inside the event folder: packed dumps and expanded digests before they move into place."""
CONTEXT_SUFFIX = "context.json"
STACKS_SUFFIX = "stacks.txt"
NATIVE_STACKS_SUFFIX = "native-stacks.txt"
TRACE_SUFFIX = "fr.pkl"
EVENT_PREFIXES = ("stall-", "ondemand-", "exception-")


def rank_prefix(rank: int) -> str:
    return f"{RANK_PREFIX}{rank:05d}"


def rank_file(rank: int, suffix: str) -> str:
    """``rank_<R:05d>.<suffix>``."""
    return f"{rank_prefix(rank)}.{suffix}"


def trace_file(rank: int, backend_tag: str) -> str:
    return rank_file(rank, f"{backend_tag}.{TRACE_SUFFIX}")


def native_stacks_path(dump_dir: Path, rank: int) -> Path:
    """Where a rank's faulthandler timer writes (the run's dump folder, hidden until needed)."""
    return Path(dump_dir) / f".{rank_file(rank, NATIVE_STACKS_SUFFIX)}"


def teardown_stacks_path(dump_dir: Path, rank: int) -> Path:
    return Path(dump_dir) / f"teardown-rank{rank}.{STACKS_SUFFIX}"


RANK_DETAIL_FILE = "summary-ranks.json"
"""The per-rank detail beside ``summary.json`` (``docs/summary-json.md``), written after it."""
REPORT_FILES = ("summary.json", "summary.txt", "summary.html", "summary.md", RANK_DETAIL_FILE)
STRAGGLERS_FILE = "stragglers.json"
"""Live straggler detection's scores, in the run's dump folder and in each event folder."""


def is_plugin_side_file(name: str) -> bool:
    """A file this plugin writes beside the dumps that is no dump: reports, the collection
    file, native and teardown stack files, a temporary file of an atomic write."""
    return (name in REPORT_FILES or name in (COLLECTION_FILE, STRAGGLERS_FILE) or name.endswith(f".{NATIVE_STACKS_SUFFIX}")
            or (name.startswith("teardown-rank") and name.endswith(f".{STACKS_SUFFIX}"))
            or name.endswith((".tmp", ".partial")))


RUN_ID_VARIABLE = "LIGHTNING_NCCLX_RUN_ID"
"""Names the run folder; set by the launching process for Lightning's own launchers."""


def run_id_from_environment(environ: os._Environ[str] | dict[str, str] | None = None) -> str | None:
    """An id that every rank of this run sees identically, from the launcher's environment."""
    env = os.environ if environ is None else environ
    explicit = env.get(RUN_ID_VARIABLE)
    if explicit:
        return explicit
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return f"torchrun-{elastic}"
    slurm = env.get("SLURM_JOB_ID")
    if slurm:
        step = env.get("SLURM_STEP_ID")
        return f"slurm-{slurm}" + (f".{step}" if step else "")
    return None
