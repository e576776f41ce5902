"""Tiny synthetic flight-recorder dumps in torch's format 2.10 (for cases CPU gloo cannot make)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

T0 = 1_796_000_000_000_000_000


def entry(record_id: int, seq: int, op: str = "all_reduce", *, lib: str = "nccl", pg: tuple = ("0", "default_pg"),
          size: int = 4, dtype: str = "Float", state: str = "completed", p2p_seq: int = 0, is_p2p: bool = False,
          t_ns: int | None = None, frames: list | None = None) -> dict:
    return {"record_id": record_id, "pg_id": int(pg[0]) if pg[0].isdigit() else 0, "process_group": pg,
            "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "op_id": record_id + 1,
            "profiling_name": f"{lib}:{op}", "time_created_ns": t_ns if t_ns is not None else T0 + record_id * 1000,
            "input_sizes": [[size]], "input_dtypes": [dtype], "output_sizes": [[size]], "output_dtypes": [dtype],
            "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": is_p2p, "thread_name": "python",
            "thread_id": "1", "frames": frames or []}


def dump(entries: list, groups: dict[str, tuple[str, list[int]]]) -> dict:
    return {"version": "2.10", "comm_lib_version": "2.28.9", "pg_status": {},
            "pg_config": {n: {"name": n, "desc": d, "ranks": str(r)} for n, (d, r) in groups.items()},
            "entries": entries}


def write(folder: Path, name: str, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(pickle.dumps(data))
    return path


def collectives(n: int, *, lib: str = "nccl", last_state: str = "completed", start: int = 1, **kw) -> list:
    out = [entry(i, start + i, lib=lib, **kw) for i in range(n)]
    if out:
        out[-1]["state"] = last_state
        out[-1]["retired"] = last_state == "completed"
    return out


def cross_group_deadlock(folder: Path) -> Path:
    """Two ranks, groups 0 (default_pg) and 1 (tp): rank 0 waits in tp while rank 1 waits in the
    default group, each for the other. Returns ``folder``."""
    groups = {"0": ("default_pg", [0, 1]), "1": ("tp", [0, 1])}
    for r in range(2):
        es = [entry(0, 1), entry(1, 1, pg=("1", "tp")), entry(2, 2),
              entry(3, 2, pg=("1", "tp"), state="started") if r == 0 else entry(3, 3, state="started")]
        write(folder, f"rank_{r:05d}.nccl.fr.pkl", dump(es, groups))
    return folder


def _template(state: str) -> str:
    """One entry as JSON with %d slots for its record id, sequence id and creation time."""
    text = json.dumps(entry(0, 1, state=state))
    for field, value in (("record_id", 0), ("collective_seq_id", 1), ("time_created_ns", T0)):
        text = text.replace(f'"{field}": {value}', f'"{field}": %d')
    return text


def giant_json(path: Path, megabytes: int) -> int:
    """A JSON dump of ``megabytes`` MB: one entries list of collectives 1, 2, 3, ...; the last
    one unfinished. Returns how many entries it holds."""
    done, pending = _template("completed"), _template("started")
    n = megabytes * 10**6 // (len(done % (10**6, 10**6, T0)) + 2)
    head = json.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                             "ranks": "[0, 1, 2]"}}})[:-1]
    with open(path, "w") as fh:
        fh.write(head + ', "entries": [')
        for start in range(0, n - 1, 10_000):
            fh.write(", ".join(done % (i, i + 1, T0 + i) for i in range(start, min(n - 1, start + 10_000))) + ", ")
        fh.write(pending % (n - 1, n, T0 + n) + "]}")
    return n


def p2p_folder(folder: Path, world: int, in_all_reduce: tuple[int, ...],
               p2p: dict[int, list[tuple[str, int, int]]]) -> Path:
    """A gloo job of ``world`` ranks after four all_reduces of the default group: the ranks
    ``in_all_reduce`` wait in the fifth; ``p2p`` lists, per rank, the sends and recvs it has in
    flight on group 1 (every rank, point-to-point only) as (op, src, dst) in group ranks, as the
    watchdog writes them to context.json (gloo's recorder keeps none). A rank in neither is outside
    every collective. Returns ``folder``."""
    groups = {"0": ("default_pg", list(range(world))), "1": ("pipe", list(range(world)))}
    for rank in range(world):
        last = "scheduled" if rank in in_all_reduce else "completed"
        es = collectives(4, lib="gloo")
        if rank in in_all_reduce:
            es = es + collectives(1, lib="gloo", last_state=last, start=5)
            es[-1]["record_id"] = 4
        write(folder, f"rank_{rank}.gloo.fr.pkl", dump(es, groups))
        ops = [{"backend": "gloo", "group": "1", "op": op, "src": src, "dst": dst, "peer": dst if op == "send" else src,
                "op_id": 20 + i, "sizes": [[4]], "dtype": "float32", "seconds": 3.0}
               for i, (op, src, dst) in enumerate(p2p.get(rank, ()))]
        context = {"rank": rank, "world_size": world, "event": "stall-001", "reason": "stall",
                   "pg_config": {n: {"desc": d, "ranks": r} for n, (d, r) in groups.items()},
                   "trace_files": [f"rank_{rank}.gloo.fr.pkl"], "p2p_in_flight": ops}
        (folder / f"rank_{rank}.context.json").write_text(json.dumps(context))
    return folder
