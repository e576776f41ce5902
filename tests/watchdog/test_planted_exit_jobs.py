"""A store client tries to end a healthy ``dump_and_exit`` job: it plants a stall event naming
rank 0 as its initiator, rings every bell, and spoils the ``moved`` roster so that the event can
never count as recovered (a roster over the size cap, or the roster deleted as fast as the ranks
write it). Each rank dumps (the worst a store client can do); no rank may leave, because no
rank's own heartbeat says it is stuck.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from hostile_checks import Sandbox
from hostile_store import HostileStore
from support import clean_env, free_port, kill_session, start_job

from lightning_ncclx.events.keys import meta_key, roster_key
from lightning_ncclx.events.wire import EventMeta, parse_rank_lines

JOB = Path(__file__).resolve().parent / "jobs" / "train_job.py"
WORLD = 2
JOB_SECONDS = 240


def test_a_roster_over_its_cap_keeps_the_lines_that_name_ranks() -> None:
    planted = b"x\n" * 4000 + b"../1\n" + b"7" * 30 + b"\n"
    ranks, notes = parse_rank_lines(planted + b"1\n" + planted + b" 0 \n01\n5\n", WORLD, "the moved roster")
    assert ranks == [1, 0]
    assert len(notes) == 1 and "over the cap" in notes[0]


def _every_watchdog_started(hostile: HostileStore) -> bool:
    lines = sum((hostile.get(n) or b"").count(b"\n") for n in hostile.names("procs/"))
    return lines >= WORLD


def _keep_deleting(hostile: HostileStore, name: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            hostile.delete(name)
        except Exception:  # noqa: BLE001 - the job ended and its store with it
            return
        time.sleep(0.01)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("spoil", ["over_the_cap", "deleted"])
def test_a_planted_stall_with_a_spoiled_moved_roster_ends_no_healthy_rank(tmp_path: Path, spoil: str) -> None:
    """Before, rank 0 (named initiator) confirmed the hang once its window passed and left with
    75 while both ranks trained. Now it checks its own heartbeat first: it moved on, so the event
    expires and the job trains to its end (exit 0)."""
    sandbox = Sandbox.create(tmp_path)
    port = free_port()
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **sandbox.env()})
    argv = [sys.executable, str(JOB), "--dump-dir", str(sandbox.dump_dir), "--devices", str(WORLD),
            "--on-stall", "dump_and_exit", "--strategy", "ddp_ncclx", "--batches", "90", "--step-sleep", "0.2"]
    proc = start_job(argv, env=env, cwd=tmp_path, log=tmp_path / "job.log")
    stop = threading.Event()
    spoiler: threading.Thread | None = None
    moved = roster_key(1, "moved")
    try:
        with HostileStore("127.0.0.1", port, timeout_seconds=60) as hostile:
            assert hostile.wait_for(lambda names: _every_watchdog_started(hostile), JOB_SECONDS), \
                (tmp_path / "job.log").read_text()
            if spoil == "over_the_cap":
                hostile.set(moved, b"planted\n" * 2000)
            else:
                spoiler = threading.Thread(target=_keep_deleting, args=(hostile, moved, stop), daemon=True)
                spoiler.start()
            hostile.set(meta_key(1), EventMeta.new(1, "stall", 0, time.time()).to_json())
            for rank in range(WORLD):
                hostile.set(f"bell/{rank}", "1")
            code = proc.wait(timeout=JOB_SECONDS)
            stop.set()
            if spoiler is not None:
                spoiler.join(30)
    finally:
        stop.set()
        kill_session(proc)
        proc.wait()
    log = (tmp_path / "job.log").read_text(errors="replace")
    assert (sandbox.dump_dir / "stall-001").is_dir(), log[-4000:]  # the event happened: every rank dumped
    assert "exiting with code" not in log, log[-4000:]
    assert code == 0, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
