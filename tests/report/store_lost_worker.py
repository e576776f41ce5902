"""One rank of a 3-rank gloo job (a FileStore: no TCPStore to lose) whose rank 0 leaves after the
first all_reduce; ranks 1 and 2 then write their dumps the way the watchdog does when the job's
store is gone (``dump_without_store``).

    python store_lost_worker.py RANK INIT_FILE DUMP_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from lightning_ncclx.events.connection import StoreUnavailable
from lightning_ncclx.watchdog.store_lost import dump_without_store


def main() -> None:
    rank, init_file, dump_dir = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        os._exit(0)  # the store's host goes; nothing of it is left behind
    dump_without_store(dump_dir, rank=rank, number=1, reason="exception",
                       exception="RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:30098",
                       error=StoreUnavailable("the job's store refused a new connection"),
                       progress={"phase": "train_step", "step": 3, "seconds_since_heartbeat": 1.5})
    os._exit(0)  # no destroy_process_group: its peer is gone


if __name__ == "__main__":
    main()
