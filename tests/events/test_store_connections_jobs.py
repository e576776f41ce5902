"""How many connections each rank of a real job holds to the job's store: the job's own (torch's),
one the watchdog, consensus and straggler detection share, and the doorbell's. Counted from
``/proc`` (client sockets whose remote port is ``MASTER_PORT``) while a 2-rank ``ddp_ncclx`` job
with every default runs; at 16,384 ranks each extra connection is 16,384 sockets on one host."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hostile_checks import descendants
from support import clean_env, free_port, kill_session, start_job

JOB = Path(__file__).resolve().parents[1] / "watchdog" / "jobs" / "train_job.py"
WORLD = 2
MAX_CONNECTIONS_PER_RANK = 3


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _client_inodes_to(port: int, pid: int) -> set[str]:
    """Inodes of established TCP sockets (in ``pid``'s network namespace) whose remote port is ``port``."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                found.add(inode)
    return found


def store_connections(pid: int, port: int) -> int:
    return len(_socket_inodes(pid) & _client_inodes_to(port, pid))


@pytest.mark.timeout(300)
def test_each_rank_holds_at_most_three_store_connections(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    argv = [sys.executable, str(JOB), "--dump-dir", str(tmp_path / "dumps"), "--devices", str(WORLD),
            "--strategy", "ddp_ncclx", "--batches", "60", "--step-sleep", "0.2"]
    proc = start_job(argv, env=env, cwd=tmp_path, log=tmp_path / "job.log")
    seen: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            for pid in [proc.pid, *descendants(proc.pid)]:
                count = store_connections(pid, port)
                seen[pid] = max(seen.get(pid, 0), count)
            if len(seen) >= WORLD and sum(1 for c in seen.values() if c == MAX_CONNECTIONS_PER_RANK) >= WORLD:
                time.sleep(2.0)  # a few more samples once every rank is fully connected
                for pid in list(seen):
                    seen[pid] = max(seen[pid], store_connections(pid, port))
                break
            time.sleep(0.1)
    finally:
        kill_session(proc)
        proc.wait()
    log = (tmp_path / "job.log").read_text(errors="replace")
    ranks = sorted(seen.values(), reverse=True)[:WORLD]
    assert ranks == [MAX_CONNECTIONS_PER_RANK] * WORLD, f"{seen}\n{log[-3000:]}"
    assert max(seen.values()) <= MAX_CONNECTIONS_PER_RANK, seen
