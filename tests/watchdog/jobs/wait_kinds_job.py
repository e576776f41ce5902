"""Two gloo ranks: rank 0 waits, one after the other, in each kind of op the strategies and users
issue while rank 1 holds back; a thread on rank 0 probes where it waits during each wait. Prints
one JSON line: op kind -> [collectives blocked in, point-to-point ops in flight].

    python wait_kinds_job.py <rank> <port> <folder>
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from lightning_ncclx.dump.p2p_ops import TRACKER
from lightning_ncclx.watchdog.collective_probe import blocked_collectives, p2p_waits


def kinds(rank: int, fresh: dist.ProcessGroup, mesh_group: dist.ProcessGroup) -> Iterator[tuple[str, Callable]]:
    yield "all_gather_into_tensor, first op of a new group", lambda: dist.all_gather_into_tensor(
        torch.empty(4), torch.ones(2), group=fresh)
    yield "reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(4))
    yield "all_reduce_coalesced", lambda: dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
    yield "device mesh group", lambda: dist.all_reduce(torch.ones(2), group=mesh_group)
    yield "async work.wait()", lambda: dist.all_reduce(torch.ones(2), async_op=True).wait()
    op = dist.P2POp(dist.irecv, torch.empty(2), 1) if rank == 0 else dist.P2POp(dist.isend, torch.ones(2), 0)
    yield "batch_isend_irecv", lambda: [work.wait() for work in dist.batch_isend_irecv([op])]


def main() -> int:
    rank, port, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    fresh = dist.new_group([0, 1])
    mesh_group = init_device_mesh("cpu", (1, 2), mesh_dim_names=("pp", "dp")).get_group("dp")
    TRACKER.attach()
    seen: dict[str, list] = {}
    for i, (name, run) in enumerate(kinds(rank, fresh, mesh_group)):
        release = os.path.join(folder, f"release_{i}")
        if rank == 0:
            def probe(name: str = name, release: str = release) -> None:
                time.sleep(0.8)
                seen[name] = [[[b.backend, b.op_id] for b in blocked_collectives()],
                              [[w.op, w.peer] for w in p2p_waits()]]
                open(release, "w").close()

            thread = threading.Thread(target=probe)
            thread.start()
            run()
            thread.join()
        else:
            while not os.path.exists(release):
                time.sleep(0.02)
            run()
    if rank == 0:
        print("SEEN " + json.dumps(seen), flush=True)
    TRACKER.detach()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
