"""Two gloo ranks: rank 0 waits in an all_reduce on a sub-group while rank 1 holds back; a thread
on rank 0 probes where its rank waits, before and during that wait. Prints one JSON line.

    python probe_job.py <rank> <port> <release file>
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from lightning_ncclx.watchdog.collective_probe import blocked_collectives


def settled() -> list:
    """gloo marks an op completed on its worker thread just after the caller's wait returns: on a
    loaded machine the last op can still show unfinished for a moment. The probe once it settles."""
    deadline = time.monotonic() + 10.0
    found = blocked_collectives()
    while found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = blocked_collectives()
    return found


def main() -> int:
    rank, port, release = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sub = dist.new_group(backend="gloo")
    for _ in range(5):
        dist.all_reduce(torch.ones(2), group=sub)
    idle = settled()
    found: dict[str, object] = {}
    if rank == 0:
        def probe() -> None:
            time.sleep(1.0)
            found["blocked"] = [[b.backend, b.pg_id, b.op_id] for b in blocked_collectives()]
            open(release, "w").close()

        thread = threading.Thread(target=probe)
        thread.start()
        dist.all_reduce(torch.ones(2), group=sub)
        thread.join()
        found["after"] = [[b.backend, b.pg_id, b.op_id] for b in settled()]
        found["idle"] = [[b.backend, b.pg_id, b.op_id] for b in idle]
        print("PROBE " + json.dumps(found), flush=True)
    else:
        while not os.path.exists(release):
            time.sleep(0.05)
        dist.all_reduce(torch.ones(2), group=sub)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
