"""Launch small real gloo jobs (one process per rank, forked by :mod:`gloo_job`; 127.0.0.1, a free
port) and collect dumps.

Used by ``conftest.py`` (one run per pytest process, shared by many tests). Every child is waited for
or killed; nothing outlives :func:`run_jobs`.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).with_name("gloo_job.py")
SCENARIOS = ("healthy", "skip", "op", "size", "outside", "subgroup", "wrap", "uneven", "uneven_skip", "order", "extra",
             "pipe_skip", "pipe_wrong")


def free_port() -> int:
    """See :func:`support.free_port`."""
    from support import free_port as below_the_ephemeral_range

    return below_the_ephemeral_range()


RANK_MEMORY_BYTES = 500 << 20
"""What one rank of these jobs may hold (torch imported, gloo up: ~370 MB RSS), with a margin."""
SLOT_FOLDER = Path(tempfile.gettempdir()) / "lightning-ncclx-test-rank-slots"


def machine_rank_slots(world: int, total_bytes: int | None = None) -> int:
    """Ranks of these jobs that may run at once on this machine, whatever number of pytest
    processes start them (the workers of one test run, or of several runs at once): half its
    memory's worth, and at least one job. The same number in every process, so that they share
    one set of slots."""
    if total_bytes is None:
        total_bytes = _meminfo("MemTotal:", 8 << 30)
    return max(world, total_bytes // 2 // RANK_MEMORY_BYTES)


def _meminfo(field: str, fallback: int) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return fallback


class RankSlots:
    """Machine-wide slots, one locked file each (``flock``): a process holds a slot while one rank
    of its jobs runs. Every pytest process of this machine draws from the same files, so two test
    sessions at once (each with its workers) never start more ranks together than there is memory
    for. A lock dies with its process: no slot outlives a killed session."""

    def __init__(self, capacity: int, folder: Path = SLOT_FOLDER) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._paths = [folder / f"slot_{i}" for i in range(capacity)]

    def take(self, n: int) -> list[int] | None:
        """``n`` slots (their descriptors), or None and nothing held when fewer are free."""
        held: list[int] = []
        try:
            for path in self._paths:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                held.append(fd)
                if len(held) == n:
                    return held
        except BaseException:
            self.give(held)
            raise
        self.give(held)
        return None

    @staticmethod
    def give(held: list[int]) -> None:
        for fd in held:
            os.close(fd)  # closing the only descriptor of the open file releases its lock
        held.clear()


def run_jobs(scenarios: dict[str, Path], world: int = 3, timeout_s: float = 240.0) -> dict[str, Path]:
    """Run the scenarios' jobs (each job's ranks concurrently), as many at once as the machine's
    rank slots allow (:class:`RankSlots`) and, past the first, as its free memory allows; returns
    scenario -> its output folder. ``timeout_s`` bounds each job from its start."""
    pending = list(scenarios.items())
    slots = RankSlots(machine_rank_slots(world))
    running: list[tuple[list[subprocess.Popen], list[int], float]] = []
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000")
    try:
        while pending or running:
            for job in [j for j in running if _ended(j[0]) or time.monotonic() > j[2]]:
                running.remove(job)
                _end(job[0])
                slots.give(job[1])
            if pending and (not running or _meminfo("MemAvailable:", 4 << 30) >= 2 * world * RANK_MEMORY_BYTES):
                held = slots.take(world)
                if held is not None:
                    scenario, out = pending.pop(0)
                    running.append((_start(scenario, out, world, env), held, time.monotonic() + timeout_s))
                    continue
            time.sleep(0.05)
    finally:
        for procs, held, _ in running:
            _end(procs)
            slots.give(held)
    return scenarios


def _start(scenario: str, out: Path, world: int, env: dict[str, str]) -> list[subprocess.Popen]:
    """The job's process (:mod:`gloo_job`: torch imported once, one forked process per rank),
    leader of its own process group."""
    out.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    job_env = dict(env, TORCH_FR_BUFFER_SIZE="12") if scenario == "wrap" else env
    return [subprocess.Popen([sys.executable, str(JOB), str(world), port, scenario, str(out)], env=job_env,
                             stdout=subprocess.DEVNULL, start_new_session=True)]


def _ended(procs: list[subprocess.Popen]) -> bool:
    return all(p.poll() is not None for p in procs)


def _end(procs: list[subprocess.Popen]) -> None:
    """Every rank of a job waited for; a job still running (past its time) killed first, its
    forked ranks with it (their process group)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
