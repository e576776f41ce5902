"""A store client plants a rank's dump that loads forever (a pickle "hash bomb": a dict key that is
a tuple sharing its parts, level after level, a few hundred bytes, no class, no function). The
summarizing rank, a training process where forking is unsafe, reads it in a helper process under a
deadline: the dump is named unreadable, the other ranks are summarized and the job ends as it
would without the planted value.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hostile_checks import Sandbox
from hostile_store import HostileStore
from support import clean_env, free_port, kill_session, start_job

from lightning_ncclx.events.keys import blob_key
from lightning_ncclx.events.packing import pack_files
from lightning_ncclx.events.wire import Announcement
from lightning_ncclx.layout import trace_file

JOB = Path(__file__).resolve().parents[1] / "watchdog" / "jobs" / "train_job.py"
JOB_SECONDS = 240


def hash_bomb(depth: int = 40) -> bytes:
    """``{"version": "2.10", "entries": [], "pg_status": {t40: 1}}`` with ``t(i+1) = (t(i), t(i))``,
    written opcode by opcode (building it in Python would hash it)."""
    out = bytearray(b"\x80\x02}(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10X\x07\x00\x00\x00entries]"
                    b"X\t\x00\x00\x00pg_status})")  # PROTO 2, EMPTY_DICT, MARK, the two keys, EMPTY_DICT, EMPTY_TUPLE
    for i in range(depth):
        out += b"q" + bytes([i]) + b"h" + bytes([i]) + b"\x86"  # BINPUT i, BINGET i, TUPLE2
    return bytes(out + b"K\x01su.")  # BININT1 1, SETITEM (into pg_status), SETITEMS (the document), STOP


def test_the_bomb_loads_at_a_small_depth_as_a_dump_of_that_shape() -> None:
    import pickle

    data = pickle.loads(hash_bomb(depth=2))
    assert data["version"] == "2.10" and data["entries"] == []
    assert list(data["pg_status"]) == [(((), ()), ((), ()))]


def _plant_dump_of_rank(hostile: HostileStore, tmp_path: Path, rank: int, event: int) -> None:
    """Rank ``rank``'s announcement of event ``event``, as from another host, and its packed dump."""
    folder = tmp_path / "planted"
    folder.mkdir()
    name = trace_file(rank, "gloo")
    (folder / name).write_bytes(hash_bomb())
    blob = pack_files([folder / name])
    hostile.set(blob_key(event, rank, 0), blob)
    hostile.set(blob_key(event, rank), json.dumps({"chunks": 1, "bytes": len(blob)}))
    hostile.set(f"ev/{event}/rank/{rank}", Announcement(rank, "elsewhere", (name,), "/x", uploaded=True).encode())


@pytest.mark.timeout(400)
def test_a_planted_dump_that_loads_forever_is_named_unreadable_and_the_job_ends_as_it_would(tmp_path: Path) -> None:
    """Rank 2 is SIGKILLed mid-step; a store client plants rank 2's dump of the coming event as a
    hash bomb. Before, the summarizing rank's watchdog unpickled it in the training process and
    never came back (no summary, no exit). Now the summary names the file unreadable, ranks 0
    and 1 are in it, and both leave as after any peer's death."""
    sandbox = Sandbox.create(tmp_path)
    port = free_port()
    procs = []  # every rank by hand: no launcher that kills the job when rank 2 dies
    for rank in range(3):
        env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_RANK": str(rank),
                         "NODE_RANK": "0", "WORLD_SIZE": "3", "OMP_NUM_THREADS": "1", **sandbox.env()})
        argv = [sys.executable, str(JOB), "--dump-dir", str(sandbox.dump_dir), "--devices", "3",
                "--strategy", "ddp_ncclx", "--fault", "die", "--fault-rank", "2"]
        procs.append(start_job(argv, env=env, cwd=tmp_path, log=tmp_path / f"rank{rank}.log"))
    try:
        with HostileStore("127.0.0.1", port, timeout_seconds=60) as hostile:
            deadline = time.monotonic() + JOB_SECONDS
            while not hostile.names("procs/") and time.monotonic() < deadline:
                time.sleep(0.05)
            _plant_dump_of_rank(hostile, tmp_path, rank=2, event=1)
            codes = [p.wait(timeout=JOB_SECONDS) for p in procs[:2]]
    finally:
        for p in procs:
            kill_session(p)
            p.wait()
    log = "\n".join((tmp_path / f"rank{r}.log").read_text(errors="replace") for r in range(3))
    assert sorted(codes) in ([1, 75], [75, 75]), f"{codes}\n{log[-5000:]}"
    events = [p for p in sandbox.dump_dir.iterdir() if p.name.startswith(("stall-", "exception-"))]
    assert len(events) == 1, f"{events}\n{log[-5000:]}"
    summary = json.loads((events[0] / "summary.json").read_text())
    bomb = [u for u in summary["unreadable"] if u["path"].endswith(trace_file(2, "gloo"))]
    assert len(bomb) == 1 and "ended after" in bomb[0]["why"], summary["unreadable"]
    assert sorted(summary["ranks_seen"]) == [0, 1], summary
