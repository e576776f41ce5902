"""Untrusted dumps are read in forked processes, each file under a deadline.

A pickle can be built to load forever inside CPython's C unpickler, where no Python-level timeout
reaches: a dict key or set item that is a tuple whose parts are shared, level after level, is
hashed along every path (a few hundred bytes, 2**40 paths). So where forking is safe, files are
read in worker processes whose ``SIGALRM`` is left at its default action (end the process) and
armed before each file. A worker that overruns is ended by the kernel, the pool breaks, the chunks
not yet back are read again, and the chunk that broke it is read one file per process: the file
that overruns alone is unreadable, with the reason, and every other file is read.

Inside a training job (torch loaded, other threads running) forking is not safe; files are read
in the process itself, as they are the job's own.
"""

from __future__ import annotations

import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import repeat
from typing import Callable, Sequence, TypeVar

from lightning_ncclx.analysis.discover import Candidate
from lightning_ncclx.analysis.model import Unreadable

DEADLINE_S = 10.0
"""Seconds one file may take to be read, plus :data:`DEADLINE_S_PER_MIB` per MiB of it. An honest
dump is read at 50-100 MiB/s; a 30 MiB one has 40 s."""
DEADLINE_S_PER_MIB = 1.0

T = TypeVar("T")


def fork_safe() -> bool:
    """Linux, and nothing in this process that a fork would break (torch, CUDA, other threads)."""
    import threading

    return sys.platform == "linux" and "torch" not in sys.modules and threading.active_count() == 1


def deadline_s(path: str) -> float:
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    return DEADLINE_S + DEADLINE_S_PER_MIB * size / (1 << 20)


def read_isolated(jobs: Sequence[Candidate], processes: int, chunk: int,
                  read_one: Callable[[Candidate], T]) -> list[T | Unreadable]:
    """``read_one`` of every job in ``processes`` forked workers, ``chunk`` jobs per task, in
    order. ``read_one`` must be a module-level function (it is sent to the workers by name)."""
    chunks = [list(jobs[i:i + chunk]) for i in range(0, len(jobs), chunk)]
    done: list[list[T | Unreadable]] = []
    while len(done) < len(chunks):
        try:
            with _pool(processes) as pool:
                for got in pool.map(_read_chunk, repeat(read_one), chunks[len(done):]):
                    done.append(got)
        except BrokenProcessPool:  # this chunk, or one read beside it, ended its worker: one file per process
            done.append([_alone(read_one, job) for job in chunks[len(done)]])
    return [item for got in done for item in got]


def _pool(processes: int) -> ProcessPoolExecutor:
    import multiprocessing

    return ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("fork"),
                               initializer=_ended_by_alarm)


def _ended_by_alarm() -> None:
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a handler inherited from the parent (pytest's) would wait for Python


def _read_chunk(read_one: Callable[[Candidate], T], jobs: list[Candidate]) -> list[T]:
    out = []
    try:
        for job in jobs:
            signal.setitimer(signal.ITIMER_REAL, deadline_s(job.path))
            out.append(read_one(job))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return out


def _alone(read_one: Callable[[Candidate], T], job: Candidate) -> T | Unreadable:
    try:
        with _pool(1) as pool:
            return pool.submit(_read_chunk, read_one, [job]).result()[0]
    except BrokenProcessPool:
        return Unreadable(job.path, f"the process reading it was ended after {deadline_s(job.path):.0f} s or died: "
                                    "a file built to take forever or all memory to load (e.g. a pickle whose dict "
                                    "key is a tuple sharing its parts, level after level), or a far too slow machine")
