"""``stop()`` closes the watchdog's store connection at once, not when the garbage collector
frees the runtime: three watchdogs in turn (three fits, or a fit and a validate) on one real
``TCPStore`` leave this process with the connections it had before (the collector off, as between
its runs)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from support import clean_env, free_port

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import gc, json, os, sys, time
    from pathlib import Path
    import torch.distributed as dist
    from lightning_ncclx.config import WatchdogConfig
    from lightning_ncclx.watchdog.runtime import WatchdogRuntime

    port = int(sys.argv[1])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

    def client_connections() -> int:
        inodes = set()
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        count = 0
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                    count += 1
        return count

    gc.collect()
    gc.disable()
    counts = [client_connections()]
    for run in range(3):
        runtime = WatchdogRuntime(WatchdogConfig(poll_interval_seconds=0.2), Path(sys.argv[2]))
        runtime.start()
        deadline = time.monotonic() + 60
        while not runtime._armed and time.monotonic() < deadline:
            time.sleep(0.05)
        runtime.stop()
        del runtime
        time.sleep(0.5)
        counts.append(client_connections())
    print("COUNTS", json.dumps(counts))
    dist.destroy_process_group()
""")


def test_three_watchdogs_in_turn_leave_no_store_connection_behind(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(free_port()), str(tmp_path / "dumps")],
                          capture_output=True, text=True, timeout=240, cwd=REPO, env=clean_env())
    lines = [line for line in done.stdout.splitlines() if line.startswith("COUNTS")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    counts = json.loads(lines[0].split(" ", 1)[1])
    assert counts == [counts[0]] * 4, counts
