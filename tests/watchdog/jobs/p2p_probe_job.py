"""Three gloo ranks in a send/recv pipeline: rank 0 holds back its send; rank 1 waits in ``recv``
from rank 0 (default group), rank 2 in ``irecv(...).wait()`` from rank 1 (a sub-group made after
the tracker first attached). A thread on ranks 1 and 2 probes where its rank waits, then lets
rank 0 go. Prints one JSON line per rank.

    python p2p_probe_job.py <rank> <port> <folder>
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from lightning_ncclx.dump.p2p_ops import TRACKER, p2p_in_flight
from lightning_ncclx.watchdog.collective_probe import blocked_collectives, p2p_waits


def wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.05)


def main() -> int:
    rank, port, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    found: dict[str, object] = {"hooked_at_start": TRACKER.attach()}
    sub = dist.new_group([1, 2])
    found["hooked_later"] = TRACKER.attach()
    t = torch.ones(4)
    for _ in range(3):  # healthy traffic first: completed ops leave nothing behind
        if rank == 0:
            dist.send(t, 1)
        if rank == 1:
            dist.recv(t, 0)
            dist.isend(t, 2, group=sub).wait()
        if rank == 2:
            dist.irecv(t, 1, group=sub).wait()
        dist.all_reduce(t)
    found["after_healthy"] = p2p_in_flight()
    # an all_reduce returns before gloo's worker thread marks it completed: let it settle (under
    # load that took over the probe's 1 s once, and the probe saw it as a wait)
    settle_by = time.monotonic() + 30.0
    while blocked_collectives() and time.monotonic() < settle_by:
        time.sleep(0.05)
    if rank in (1, 2):
        def probe() -> None:
            time.sleep(1.0)
            found["waits"] = [[w.backend, w.group, w.op, w.src, w.dst, w.peer] for w in p2p_waits()]
            found["context"] = p2p_in_flight()
            found["collectives"] = [[b.backend, b.pg_id, b.op_id] for b in blocked_collectives()]
            open(os.path.join(folder, f"probed_{rank}"), "w").close()

        thread = threading.Thread(target=probe)
        thread.start()
        if rank == 1:
            dist.recv(t, 0)
            dist.send(t, 2, group=sub)
        else:
            dist.irecv(t, 1, group=sub).wait()
        thread.join()
    else:
        wait_for(os.path.join(folder, "probed_1"))
        wait_for(os.path.join(folder, "probed_2"))
        dist.send(t, 1)
    found["after"] = p2p_in_flight()
    TRACKER.detach()
    if rank == 0:
        dist.send(t, 1)
    if rank == 1:
        dist.recv(t, 0)
    found["after_detach"] = [w.op for w in TRACKER.in_flight()]
    print("PROBE " + json.dumps(found), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
