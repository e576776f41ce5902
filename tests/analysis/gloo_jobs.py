"""Launch small real gloo jobs (one process per rank, 127.0.0.1, a free port) and collect dumps.

Used by ``conftest.py`` (one module-scoped run shared by many tests). Every child is waited for
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


def run_jobs(scenarios: dict[str, Path], world: int = 3, timeout_s: float = 240.0) -> dict[str, Path]:
    """Run each scenario's ranks concurrently; returns scenario -> its output folder."""
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000")
    try:
        for scenario, out in scenarios.items():
            out.mkdir(parents=True, exist_ok=True)
            port = str(free_port())
            job_env = dict(env, TORCH_FR_BUFFER_SIZE="12") if scenario == "wrap" else env
            for rank in range(world):
                procs.append(subprocess.Popen(
                    [sys.executable, str(WORKER), str(rank), str(world), port, scenario, str(out)],
                    env=job_env, stdout=subprocess.DEVNULL, stderr=open(out / f"stderr_{rank}.txt", "wb")))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return scenarios
