"""The README's demo (``make demo``): a real 3-process FSDP job on CPU that hangs on purpose and
ends with the stall summary the watchdog wrote.

It runs the FSDP recipe with ``trainer=ddp_sim model=gpt_tiny +fault=skip_collective``: at batch
3 rank 2 skips an all_reduce that ranks 0 and 1 enter. The watchdog notices within 10 s, dumps
every rank, summarizes and ends the job (on_stall=dump_and_exit, with the exit status of the hang
kind: 76 for a program divergence, by default). The demo then
prints ``stall-001/summary.txt`` and where the dump folder and ``summary.html`` are, and exits 0
when the summary names rank 2. About a minute on 2 cores.

    python examples/demo.py [--out DIR] [--strategy fsdp_ncclx|fsdp2_ncclx|ddp_ncclx] [--rank 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lightning_ncclx.config import WatchdogConfig, exit_code_for

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: outputs/demo/<time>)")
    parser.add_argument("--strategy", default="fsdp_ncclx", choices=("fsdp_ncclx", "fsdp2_ncclx", "ddp_ncclx"))
    parser.add_argument("--fault", default="skip_collective", choices=("skip_collective", "wrong_op", "stuck"))
    parser.add_argument("--rank", type=int, default=2, help="the faulty rank (0-2)")
    args = parser.parse_args()
    out = (args.out or Path("outputs") / "demo" / time.strftime("%Y-%m-%d_%H-%M-%S")).absolute()
    cmd = [
        sys.executable, str(HERE / "train_fsdp.py"),
        f"strategy={args.strategy}", "trainer=ddp_sim", "model=gpt_tiny",
        f"+fault={args.fault}", f"fault.rank={args.rank}", "fault.step=3",
        f"hydra.run.dir={out}",
    ]
    print("demo: 3 CPU ranks, rank", args.rank, "injects", args.fault, "at batch 3; running:")
    print("  " + " ".join(cmd[1:]), flush=True)
    log_path = out / "demo_job.log"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = job.wait(timeout=240)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(job.pid, 9)  # no rank outlives the demo
            except ProcessLookupError:
                pass
            job.wait()
    print(f"demo: the job ended after {time.monotonic() - started:.0f} s with exit code {code}")
    stall = out / "ncclx_dumps" / "stall-001"
    summary_txt, summary_json = stall / "summary.txt", stall / "summary.json"
    if not summary_txt.is_file():
        print(f"demo: no summary in {stall}; the job's log is {log_path}; its last lines:", file=sys.stderr)
        print("\n".join(log_path.read_text(errors="replace").splitlines()[-30:]), file=sys.stderr)
        return 1
    print("\n" + "=" * 30 + f" {summary_txt} " + "=" * 30)
    print(summary_txt.read_text().rstrip())
    print("=" * 80)
    print(f"dump folder : {stall}")
    print(f"report      : {stall / 'summary.html'}")
    print(f"job log     : {log_path}")
    print(f"again       : lightning-ncclx summarize {stall}")
    summary = json.loads(summary_json.read_text()) if summary_json.is_file() else {}
    culprits, kind = summary.get("culprit_ranks", []), summary.get("hang_kind")
    expected = exit_code_for(kind, WatchdogConfig())
    if code == expected and args.rank in culprits:
        print(f"demo: OK - the summary names rank {args.rank}, the rank that caused the hang; kind {kind}, "
              f"exit status {code} (ncclx.watchdog.exit_codes)")
        return 0
    print(f"demo: unexpected outcome (exit code {code}, culprit ranks {culprits})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
