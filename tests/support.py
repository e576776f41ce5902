"""Helpers shared by the multi-process tests: run a job in its own process session and never
leave it behind."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


@dataclass
class JobResult:
    returncode: int
    output: str
    timed_out: bool

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


PORTS_PER_BLOCK = 100
BLOCKS = 120
FIRST_PORT = 20000
"""Ports for the jobs' stores and servers, below the kernel's ephemeral range (32768 and up on
Linux): a port the kernel hands out with ``bind(0)`` is free only until any outgoing connection
takes it as its source port, and another test's job did so (EADDRINUSE at the store's start).
Each process takes a block of its own, held by a ``flock`` on a file for as long as it lives (so
two pytest sessions at once never share one), and hands out its ports in turn, skipping those in
use."""
_block: list = []
_next_port: list[int] = []


def _claim_block() -> int | None:
    folder = Path(tempfile.gettempdir()) / "ncclx-test-ports"
    folder.mkdir(exist_ok=True)
    for tried in range(BLOCKS):
        number = (os.getpid() + tried) % BLOCKS
        handle = open(folder / f"block-{number}", "a")  # noqa: SIM115 - kept open: the lock lives with it
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _block.append(handle)
        return FIRST_PORT + number * PORTS_PER_BLOCK
    return None


def free_port(count: int = 1) -> int:
    """A port nothing listens on, or the first of ``count`` consecutive ones (a job whose ranks
    each serve on port + local rank); never one handed out before by this process."""
    if not _next_port:
        first = _claim_block()
        _next_port.extend([0, first if first is not None else -1])
    offset, block = _next_port
    for _ in range(PORTS_PER_BLOCK if block >= 0 else 0):
        if offset + count > PORTS_PER_BLOCK:
            offset = 0
        first = block + offset
        offset += count
        _next_port[0] = offset
        if all(map(_bindable, range(first, first + count))):
            return first
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no block free: the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port still in TIME_WAIT is skipped too
        except OSError:
            return False
    return True


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without launcher/rank variables a previous job left."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCH_FR_", "TORCH_NCCL_", "LIGHTNING_NCCLX", "SLURM_", "TORCHELASTIC_", "PL_"))
        and k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "LOCAL_WORLD_SIZE")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    if extra:
        env.update(extra)
    return env


def kill_session(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_job(
    argv: Sequence[str],
    *,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> JobResult:
    """Run ``argv`` in a new process session; on timeout (or any exit) kill the whole session so
    no rank outlives the test."""
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env) if env is not None else clean_env(),
        cwd=str(cwd) if cwd else None,
        start_new_session=True,
    )
    timed_out = False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_session(process)
        output, _ = process.communicate()
    finally:
        kill_session(process)
    return JobResult(process.returncode, output.decode(errors="replace"), timed_out)


def start_job(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None, log: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (for several ranks started by hand); caller kills it."""
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=str(cwd) if cwd else None, start_new_session=True)


def contexts(folder: Path) -> dict[int, dict[str, Any]]:
    """rank -> context.json, from an event folder and its ``ranks/<host>/`` copies."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.rglob("rank_*.context.json")):
        data = json.loads(path.read_text())
        out.setdefault(int(data["rank"]), data)
    return out


class FakeClock:
    """A clock the test moves by hand; also a ``sleep`` that only moves it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    sleep = advance


@contextmanager
def one_rank_gloo(store_file: Path, sub_desc: str = "my_sub", calls_in_sub: int = 1) -> Iterator[Any]:
    """A real 1-rank gloo job (file store) with a subgroup ``sub_desc``: one all_reduce in the
    default group, ``calls_in_sub`` in the subgroup; the subgroup is yielded, the job destroyed."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=0, world_size=1)
    try:
        sub = dist.new_group([0], backend="gloo", group_desc=sub_desc)
        t = torch.ones(2)
        dist.all_reduce(t)
        for _ in range(calls_in_sub):
            dist.all_reduce(t, group=sub)
        yield sub
    finally:
        dist.destroy_process_group()
