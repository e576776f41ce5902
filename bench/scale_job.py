"""The dumps of a simulated N-rank job stuck outside a collective, for ``bench_event_scale.py``.

8 ranks per host; groups: the default group (every rank) and one tensor-parallel group per host
(``tp``). Each step is a ``tp`` all_reduce, then a default-group all_reduce (NCCL-like entries in
torch's format 2.10, 5 frames each, as ``tests/analysis/synth.py`` writes them). Rank
``culprit(N)`` stalls in its data loader before step ``steps``: its host's 7 other ranks wait in
that step's ``tp`` all_reduce, every other rank in its default-group all_reduce. Every rank
writes what the plugin writes: ``rank_<R>.nccl.fr.pkl``, ``rank_<R>.context.json`` and
``rank_<R>.stacks.txt`` (its main thread in ``work.wait()``, the culprit's in the data loader).

    paths = write_rank(folder, rank=5, world=1024, steps=24)   # the three files of rank 5
"""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

RANKS_PER_HOST = 8
T0 = 1_796_000_000_000_000_000
STEP_NS = 120_000_000
TORCH = "/opt/conda/lib/python3.11/site-packages/torch"
LIGHTNING = "/opt/conda/lib/python3.11/site-packages/lightning/pytorch"
TRAIN = "/home/user/project/train.py"


def culprit(world: int) -> int:
    return world // 3 + 5


def host_of(rank: int) -> str:
    return f"node-{rank // RANKS_PER_HOST:05d}"


def _frames(line: int) -> list[dict]:
    return [{"name": "all_reduce", "filename": f"{TORCH}/distributed/distributed_c10d.py", "line": 2501},
            {"name": "wrapper", "filename": f"{TORCH}/distributed/c10d_logger.py", "line": 83},
            {"name": "training_step", "filename": TRAIN, "line": line},
            {"name": "advance", "filename": f"{LIGHTNING}/loops/training_epoch_loop.py", "line": 250},
            {"name": "main", "filename": TRAIN, "line": 210}]


def _entry(record: int, seq: int, group: tuple[str, str], size: int, time_ns: int, state: str, line: int) -> dict:
    return {"record_id": record, "pg_id": int(group[0]), "process_group": group, "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": record + 1, "profiling_name": "nccl:all_reduce", "time_created_ns": time_ns,
            "input_sizes": [[size]], "input_dtypes": ["BFloat16"], "output_sizes": [[size]],
            "output_dtypes": ["BFloat16"], "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": 600000,
            "is_p2p": False, "thread_name": "pt_main_thread", "thread_id": "140692137763136",
            "frames": _frames(line)}


def trace(rank: int, world: int, steps: int) -> dict:
    """Rank ``rank``'s flight-recorder dump: ``steps`` steps of (tp, default) all_reduces."""
    rng = random.Random(rank)
    tp = (str(1 + rank // RANKS_PER_HOST), "tp")
    bad = culprit(world)
    entries = []
    for step in range(1, steps + 1):
        t = T0 + step * STEP_NS + rng.randrange(0, 400_000)
        if rank == bad and step == steps:
            break  # still in its data loader
        tp_state = "completed" if step < steps or rank // RANKS_PER_HOST != bad // RANKS_PER_HOST else "started"
        entries.append(_entry(len(entries), step, tp, 4096, t, tp_state, 120))
        if tp_state == "started":
            break
        state = "completed" if step < steps else "started"
        entries.append(_entry(len(entries), step, ("0", "default_pg"), 1 << 20, t + 9_000_000, state, 131))
    first_host = rank - rank % RANKS_PER_HOST
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))},
              tp[0]: {"name": tp[0], "desc": "tp", "ranks": str(list(range(first_host, first_host + RANKS_PER_HOST)))}}
    return {"version": "2.10", "comm_lib_version": "2.28.9", "pg_config": config, "pg_status": {}, "entries": entries}


def stacks(rank: int, world: int) -> str:
    outer = [("/opt/conda/lib/python3.11/runpy.py", 88, "_run_code"), (TRAIN, 230, "<module>"), (TRAIN, 210, "main"),
             (f"{LIGHTNING}/trainer/trainer.py", 538, "fit"), (f"{LIGHTNING}/trainer/call.py", 47, "_call_and_handle_interrupt"),
             (f"{LIGHTNING}/trainer/trainer.py", 981, "_run"), (f"{LIGHTNING}/loops/fit_loop.py", 205, "run"),
             (f"{LIGHTNING}/loops/training_epoch_loop.py", 250, "advance")]
    if rank == culprit(world):
        inner = [(f"{LIGHTNING}/loops/fetchers.py", 134, "__next__"),
                 (f"{TORCH}/utils/data/dataloader.py", 701, "__next__"), (f"{TORCH}/utils/data/dataloader.py", 1448, "_next_data"),
                 (f"{TORCH}/utils/data/dataloader.py", 1402, "_get_data"), ("/opt/conda/lib/python3.11/queue.py", 180, "get"),
                 ("/opt/conda/lib/python3.11/threading.py", 331, "wait")]
    else:
        inner = [(TRAIN, 131, "training_step"), (f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
                 (f"{TORCH}/distributed/distributed_c10d.py", 2508, "all_reduce")]
    lines = [f"# Python stacks, pid {1000 + rank}\n", "\n--- thread 'ncclx-watchdog-rank%d' (id 2) ---\n" % rank,
             '  File "/opt/conda/lib/python3.11/threading.py", line 1002, in _bootstrap\n    self._bootstrap_inner()\n',
             "\n--- thread 'MainThread' (id 1) ---\n"]
    lines += [f'  File "{f}", line {n}, in {fn}\n    pass\n' for f, n, fn in outer + inner]
    return "".join(lines)


def context(rank: int, world: int, event: str) -> dict:
    return {"schema": "lightning-ncclx/context/1", "event": event, "reason": "stall" if rank == 0 else "peer_request",
            "initiator_rank": 0, "rank": rank, "world_size": world, "local_rank": rank % RANKS_PER_HOST,
            "node_rank": rank // RANKS_PER_HOST, "host": host_of(rank), "pid": 1000 + rank, "phase": "train_step",
            "step": 41, "global_step": 41, "seconds_since_heartbeat": 95.2, "stall_threshold_seconds": 90.0,
            "time_unix": 1_796_000_100.5, "torch_version": "2.15.0+cu132", "lightning_version": "2.6.0",
            "backends": {"cuda": "nccl"}, "flight_recorder": {"TORCH_FR_BUFFER_SIZE": "20000"},
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(world))}},
            "trace_files": [f"rank_{rank:05d}.nccl.fr.pkl"], "stacks_file": f"rank_{rank:05d}.stacks.txt",
            "exception": None, "cuda_memory": None}


def files_of(folder: Path, rank: int) -> list[Path]:
    return [folder / f"rank_{rank:05d}.{suffix}" for suffix in ("nccl.fr.pkl", "context.json", "stacks.txt")]


def write_rank(folder: Path, rank: int, world: int, steps: int, event: str = "stall-001") -> list[Path]:
    paths = files_of(folder, rank)
    paths[0].write_bytes(pickle.dumps(trace(rank, world, steps), protocol=4))
    paths[1].write_text(json.dumps(context(rank, world, event), indent=2))
    paths[2].write_text(stacks(rank, world))
    return paths
