"""A dump event without the job's store: the evidence stays on this rank's disk.

The ranks agree on an event through the job's TCPStore, which usually lives in rank 0's process.
When that process dies (a collective mismatch that gloo turns into an abort, an OOM kill, a lost
node), every other rank then fails too ("Connection closed by peer"), and the event it proposes
cannot reach the store. Each such rank writes its own dump (traces, stacks, context) into
``<dump_dir>/store-lost-<NNN>/``, the number the next event would have had, so the ranks of one
host (or of a shared file system) meet in one folder without asking anyone, and its context says
why (``store_lost``). ``lightning-ncclx summarize`` of that folder names the ranks missing from it.

Example::

    folder = dump_without_store(Path("ncclx_dumps"), rank=2, number=2, reason="exception",
                                exception="RuntimeError: Connection closed by peer", error=error,
                                progress=heartbeat.progress())
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from lightning_ncclx.dump.writer import write_rank_dump

log = logging.getLogger(__name__)


def store_lost_name(number: int) -> str:
    return f"store-lost-{number:03d}"


def dump_without_store(dump_dir: Path, *, rank: int, number: int, reason: str, exception: str | None,
                       error: BaseException, progress: Mapping[str, Any], stack_traces: bool = True,
                       cuda_device: int | None = None) -> Path:
    """Write this rank's dump into ``<dump_dir>/store-lost-<number>/`` with a note of why; the folder."""
    name = store_lost_name(number)
    folder = Path(dump_dir) / name
    why = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
    raised = f" after this rank raised {exception[:500]}" if exception else ""
    note = (f"the job's store could not be reached ({why}){raised}: rank {rank} dumped without it; every rank "
            f"that could not reach it wrote to {name} in its dump folder; `lightning-ncclx summarize {folder}` "
            "names the ranks that did not (the store's host among them)")
    # the exception goes into the note, not the context's exception: its own cause is most often the
    # store host's death (its connection to that rank closed), which the analyzer must not take for
    # this rank's failure
    files = write_rank_dump(folder, event=name, reason=reason, initiator_rank=None,
                            progress={**progress, "store_lost": note}, stack_traces=stack_traces,
                            exception=None, cuda_device=cuda_device)
    log.error("[rank %d] %s; wrote %d file(s) to %s", rank, note, len(files), folder)
    return folder
