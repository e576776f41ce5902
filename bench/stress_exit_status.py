"""Exit status of a stalled job, run many times in a row: does every launcher report 75?

A real 3-rank CPU Lightning fit (``tests/watchdog/jobs/train_job.py``) in which rank 2 blocks in
its data loader; ``on_stall: dump_and_exit``. Counts the exit statuses the launching process
reports::

    python bench/stress_exit_status.py --runs 20                     # Lightning's own (popen) launcher
    python bench/stress_exit_status.py --runs 5 --launchers popen,spawn,torchrun,by_hand

``by_hand`` starts every rank itself, as ``srun`` does, and reports the highest rank's status.
Run it next to another load (a second copy, or the test suite) to shake out races.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "watchdog" / "jobs" / "train_job.py"
FAULT = ["--fault", "stuck_loader", "--fault-rank", "2"]
WORLD = 3


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LIGHTNING_NCCLX_RUN_ID")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])))
    env.update(extra or {})
    return env


def _wait(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    codes: list[int | None] = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return codes


def run_once(launcher: str, folder: Path, timeout: float) -> int | None:
    dumps = str(folder / "dumps")
    log = open(folder / "job.log", "wb")
    common = dict(stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
    if launcher == "popen":
        cmd = [sys.executable, str(JOB), "--dump-dir", dumps, "--strategy", "ddp_ncclx", *FAULT]
        return _wait([subprocess.Popen(cmd, env=_env(), **common)], timeout)[0]
    if launcher == "spawn":
        cmd = [sys.executable, str(JOB), "--dump-dir", dumps, "--strategy", "ddp_spawn", *FAULT]
        return _wait([subprocess.Popen(cmd, env=_env(), **common)], timeout)[0]
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1",
               f"--master_port={_port()}", str(JOB), "--dump-dir", dumps, "--strategy", "ddp_ncclx", *FAULT]
        return _wait([subprocess.Popen(cmd, env=_env(), **common)], timeout)[0]
    if launcher == "by_hand":
        port = str(_port())
        procs = [subprocess.Popen([sys.executable, str(JOB), "--dump-dir", dumps, "--strategy", "ddp_ncclx", *FAULT],
                                  env=_env({"MASTER_PORT": port, "LOCAL_RANK": str(r), "NODE_RANK": "0",
                                            "WORLD_SIZE": str(WORLD)}), **common) for r in range(WORLD)]
        codes = _wait(procs, timeout)
        return None if None in codes else max(c for c in codes if c is not None)
    raise SystemExit(f"unknown launcher {launcher!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--launchers", default="popen")
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--keep", type=Path, default=None, help="copy the log of each run that did not exit 75 here")
    args = parser.parse_args()
    rows = []
    for launcher in args.launchers.split(","):
        seen: collections.Counter[str] = collections.Counter()
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix=f"exit-{launcher}-") as tmp:
                code = run_once(launcher, Path(tmp), args.timeout)
                if args.keep is not None and code != 75:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(Path(tmp) / "job.log", args.keep / f"{launcher}-{i + 1}-exit{code}.log")
            seen["timeout" if code is None else str(code)] += 1
            print(f"{launcher} run {i + 1}/{args.runs}: exit {code}", flush=True)
        rows.append((launcher, args.runs, ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()))))
    print("\n| launcher | runs | exit statuses seen |\n|---|---|---|")
    for launcher, runs, seen_text in rows:
        print(f"| {launcher} | {runs} | {seen_text} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
