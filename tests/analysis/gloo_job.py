"""One small real gloo job: torch is imported once here, then each rank is forked from this
process (still single-threaded, no process group yet) and runs ``gloo_worker.py`` as its own
``__main__``. Saves all but one of each job's torch imports (~2.5 s of CPU each) and of the
first symbolization of a stack, which the first flight-recorder dump with stack traces pays
(~1.4 s of CPU: done once here, before the fork).

Run by :mod:`gloo_jobs` as the leader of its own process group (killing the group ends every rank)::

    python gloo_job.py WORLD PORT SCENARIO OUT_DIR

Each rank's stderr goes to ``OUT/stderr_<rank>.txt``; the exit status is 0 when every rank
exited 0.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

import torch  # noqa: F401 - imported once, shared by the forked ranks
import torch.distributed  # noqa: F401
from torch.utils._traceback import CapturedTraceback

import lightning_ncclx.dump.p2p_ops  # noqa: F401 - the worker's own import, made before the fork

WORKER = Path(__file__).with_name("gloo_worker.py")


def _run_rank(rank: int, world: int, port: str, scenario: str, out: Path) -> None:
    try:
        fd = os.open(out / f"stderr_{rank}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        sys.argv = [str(WORKER), str(rank), str(world), port, scenario, str(out)]
        runpy.run_path(str(WORKER), run_name="__main__")  # ends with os._exit(0)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the parent's code
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def main() -> int:
    CapturedTraceback.format_all([CapturedTraceback.extract(cpp=True)])  # the symbolizer's first use
    world, port, scenario, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            _run_rank(rank, world, port, scenario, out)
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
