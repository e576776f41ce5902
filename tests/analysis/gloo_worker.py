"""One rank of a small real gloo job that misbehaves on purpose, then dumps its flight recorder.

Run by :mod:`gloo_job`, forked once per rank (never by pytest directly)::

    python gloo_worker.py RANK WORLD PORT SCENARIO OUT_DIR

Every rank writes, once it reached the scenario's last step (blocked or not):
``OUT/ours/rank_0000R.gloo.fr.pkl`` (pg_config repaired, as lightning-ncclx writes it) with
``rank_0000R.context.json`` and ``rank_0000R.stacks.txt``; ``OUT/torch/fr_trace_rank_R`` (torch's raw
bytes, ``<prefix><rank>``); ``OUT/fixed/trace_R`` (raw with pg_config repaired, what torchfrtrace
can read). Then it waits for every rank's ``done`` marker and exits with ``os._exit(0)``.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from lightning_ncclx.dump.p2p_ops import TRACKER, p2p_in_flight

RANK, WORLD, PORT, SCENARIO, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])
CULPRIT = WORLD - 1
DUMP_DELAY_S = 1.0


def pg_config() -> dict:
    out = {}
    for pg, ranks in dist.distributed_c10d._world.pg_group_ranks.items():
        if not isinstance(pg, dist.ProcessGroup):
            continue  # non-member placeholders
        name = dist.distributed_c10d._get_process_group_name(pg)
        out[name] = {"name": name, "desc": pg.group_desc, "ranks": str(sorted(ranks))}
    return out


def format_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [f"# Python stacks, pid {os.getpid()}\n"]
    for ident, frame in sys._current_frames().items():
        lines.append(f"\n--- thread {names.get(ident, '?')!r} (id {ident}) ---\n")
        lines.extend(traceback.format_stack(frame))
    return "".join(lines)


def dump_and_exit(delay: float) -> None:
    time.sleep(delay)
    raw = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    data = pickle.loads(raw)  # this process's own bytes: trusted
    fixed = dict(data, pg_config=pg_config(), pg_config_raw=data["pg_config"])
    for sub in ("ours", "torch", "fixed"):
        (OUT / sub).mkdir(parents=True, exist_ok=True)
    (OUT / "torch" / f"fr_trace_rank_{RANK}").write_bytes(raw)
    (OUT / "fixed" / f"trace_{RANK}").write_bytes(pickle.dumps({k: v for k, v in fixed.items() if k != "pg_config_raw"}))
    prefix = OUT / "ours" / f"rank_{RANK:05d}"
    Path(f"{prefix}.gloo.fr.pkl").write_bytes(pickle.dumps(fixed))
    Path(f"{prefix}.stacks.txt").write_text(format_stacks())
    context = {"schema": "lightning-ncclx/context/1", "event": "stall-001", "reason": "stall", "rank": RANK,
               "world_size": WORLD, "host": f"host{RANK // 2}", "pg_config": {
                   k: {**v, "ranks": json.loads(v["ranks"])} for k, v in pg_config().items()},
               "trace_files": [f"rank_{RANK:05d}.gloo.fr.pkl"], "stacks_file": f"rank_{RANK:05d}.stacks.txt",
               "p2p_in_flight": p2p_in_flight()}
    Path(f"{prefix}.context.json").write_text(json.dumps(context))
    (OUT / f"done_{RANK}").touch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all((OUT / f"done_{r}").exists() for r in range(WORLD)):
        time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)


def start_dumper() -> None:
    threading.Thread(target=dump_and_exit, args=(DUMP_DELAY_S,), daemon=True, name="dumper").start()


def wait_outside_collectives() -> None:
    """Where a culprit that is stuck outside any collective sits (its stacks show this frame)."""
    while True:
        time.sleep(0.1)


def step_a(t, group=None):
    dist.all_reduce(t, group=group)


def step_b(t, group=None):
    dist.all_reduce(t, group=group)


def sync_metric(t):
    dist.all_reduce(t)


def rank_dependent_collectives() -> None:
    """A healthy stretch in which ranks legitimately record different sizes: gather (only the
    root has outputs), scatter (only the root has inputs), uneven all_to_all, the object
    collectives (built on them) and rooted collectives from a rank other than 0."""
    root = 1 % WORLD
    x = torch.full((3,), float(RANK))
    dist.gather(x, [torch.empty(3) for _ in range(WORLD)] if RANK == root else None, dst=root)
    out = torch.empty(3)
    dist.scatter(out, [torch.full((3,), float(r)) for r in range(WORLD)] if RANK == root else None, src=root)
    splits_in = [RANK + 1] * WORLD  # rank r sends r+1 elements to everyone
    splits_out = [r + 1 for r in range(WORLD)]
    received = torch.empty(sum(splits_out))
    dist.all_to_all_single(received, torch.ones(sum(splits_in)), splits_out, splits_in)
    gathered = [None] * WORLD if RANK == root else None
    dist.gather_object({"rank": RANK, "pad": "x" * RANK * 50}, gathered, dst=root)
    objs = [None]
    dist.scatter_object_list(objs, [{"to": r, "pad": "y" * r * 70} for r in range(WORLD)] if RANK == root else None,
                             src=root)
    every = [None] * WORLD
    dist.all_gather_object(every, "z" * (RANK * 30 + 1))
    box = [{"big": "w" * 500}] if RANK == root else [None]
    dist.broadcast_object_list(box, src=root)
    dist.reduce(x, dst=root)
    dist.broadcast(x, src=root)


def pipeline(fault: str) -> None:
    """Every step stage r receives from r-1, sends to r+1 (a gloo group of its own, its sends and
    recvs watched by the plugin's tracker, as the watchdog does) and joins the step's all_reduce.
    At the fourth step stage 1 skips its send (``pipe_skip``) or sends to stage 0 instead
    (``pipe_wrong``)."""
    pipe = dist.new_group(backend="gloo")
    TRACKER.attach()
    act = torch.ones(4)
    for step in range(4):
        faulty = RANK == 1 and step == 3
        if step == 3:
            start_dumper()
        if RANK > 0:
            dist.recv(act, RANK - 1, group=pipe)
        if RANK < WORLD - 1 and not (faulty and fault == "pipe_skip"):
            dist.send(act, 0 if faulty else RANK + 1, group=pipe)
        step_a(torch.ones(4))
    wait_outside_collectives()


def main() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=30))
    t = torch.ones(4)
    sub = dist.new_group([1, 2]) if SCENARIO in ("subgroup", "wrap") else None
    other = dist.new_group(list(range(WORLD))) if SCENARIO == "order" else None
    for _ in range(3):
        step_a(t)
    if SCENARIO in ("pipe_skip", "pipe_wrong"):
        pipeline(SCENARIO)
    if SCENARIO == "healthy":
        dist.barrier()
        dump_and_exit(0.0)
    if SCENARIO in ("uneven", "uneven_skip"):
        rank_dependent_collectives()
        if SCENARIO == "uneven":
            dist.barrier()
            dump_and_exit(0.0)
        start_dumper()
        if RANK != CULPRIT:
            step_a(t)
        wait_outside_collectives()
    if SCENARIO == "wrap":
        if RANK in (1, 2):
            for _ in range(30):  # fills ranks 1-2's small ring buffer with the sub-group only
                step_a(t, group=sub)
        step_b(t)
        start_dumper()
        if RANK == CULPRIT:
            dist.broadcast(t, 0)
        else:
            step_a(t)
        wait_outside_collectives()
    if SCENARIO == "extra":  # the culprit calls one all_reduce more, same sizes: gloo pairs it with the next
        for step in range(6):
            step_a(t)
            if RANK == CULPRIT and step == 3:
                sync_metric(t)
            if RANK == CULPRIT and step == 5:
                start_dumper()  # its coming step_b is the call the others never make
            step_b(t)
        if RANK != CULPRIT:
            start_dumper()
        wait_outside_collectives()
    if SCENARIO == "skip":
        step_a(t)
        if RANK != CULPRIT:
            step_b(t)  # the culprit skips this one: gloo pairs its next call with it
        start_dumper()
        step_a(t)  # blocks on ranks 0-1; on the culprit it completes (paired with their step_b)
        wait_outside_collectives()
    start_dumper()
    if SCENARIO == "op":
        dist.broadcast(t, 0) if RANK == CULPRIT else step_a(t)
    elif SCENARIO == "size":
        step_a(torch.ones(2) if RANK == CULPRIT else t)
    elif SCENARIO == "order":  # the culprit calls two groups in the opposite order: a deadlock
        first, second = (other, None) if RANK == CULPRIT else (None, other)
        step_a(t, group=first)
        step_b(t, group=second)
    elif SCENARIO == "outside":
        wait_outside_collectives() if RANK == CULPRIT else step_a(t)
    elif SCENARIO == "subgroup":
        if RANK == CULPRIT:
            wait_outside_collectives()
        elif RANK == 1:
            step_a(t, group=sub)
        else:
            step_b(t)
    wait_outside_collectives()


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a peer went away: keep quiet, the dump thread decides the exit
        print(f"rank {RANK}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        wait_outside_collectives()
