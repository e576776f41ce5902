"""Launch small real gloo jobs (one process per rank, 127.0.0.1, a free port) and collect dumps.

Used by ``conftest.py`` (one run per pytest process, shared by many tests). Every child is waited for
or killed; nothing outlives :func:`run_jobs`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).with_name("gloo_worker.py")
SCENARIOS = ("healthy", "skip", "op", "size", "outside", "subgroup", "wrap", "uneven", "uneven_skip", "order", "extra")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK_MEMORY_BYTES = 500 << 20
"""What one rank of these jobs may hold (torch imported, gloo up: ~370 MB RSS), with a margin."""


def concurrent_jobs(world: int, available_bytes: int | None = None) -> int:
    """How many jobs may run at once without running the machine out of memory (a 2-core CI runner
    may have a few GiB; 11 jobs of 3 ranks at once hold ~12 GiB)."""
    if available_bytes is None:
        available_bytes = _available_memory()
    return max(1, available_bytes // 2 // (world * RANK_MEMORY_BYTES))


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 4 << 30


def run_jobs(scenarios: dict[str, Path], world: int = 3, timeout_s: float = 240.0) -> dict[str, Path]:
    """Run the scenarios' jobs, as many at once as memory allows (each job's ranks concurrently);
    returns scenario -> its output folder. ``timeout_s`` bounds each batch of jobs."""
    pending = list(scenarios.items())
    at_once = concurrent_jobs(world)
    while pending:
        batch, pending = pending[:at_once], pending[at_once:]
        _run_batch(batch, world, timeout_s)
    return scenarios


def _run_batch(batch: list[tuple[str, Path]], world: int, timeout_s: float) -> None:
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000")
    try:
        for scenario, out in batch:
            out.mkdir(parents=True, exist_ok=True)
            port = str(free_port())
            job_env = dict(env, TORCH_FR_BUFFER_SIZE="12") if scenario == "wrap" else env
            for rank in range(world):
                with open(out / f"stderr_{rank}.txt", "wb") as stderr:
                    procs.append(subprocess.Popen(
                        [sys.executable, str(WORKER), str(rank), str(world), port, scenario, str(out)],
                        env=job_env, stdout=subprocess.DEVNULL, stderr=stderr))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
