"""GPU check of lightning-ncclx on real NCCL: one run, under 5 minutes, a pass/fail table.

    python scripts/gpu_check.py            # on a machine with CUDA (1 rank; N ranks with N GPUs)
    python scripts/gpu_check.py --cpu      # the same flow on gloo, to check the script itself

Checks:
  fit        a Lightning fit with ddp_ncclx: the serving implementation is NCCL, entries recorded
  on-demand  SIGUSR2 during the fit makes an ondemand-NNN dump with an NCCL trace
  stall      a step stalled on purpose: the watchdog writes stall-NNN with summary.json
  timeout    a collective queued behind a long torch.cuda._sleep: torch's NCCL watchdog times out
             and writes its own dump, which `lightning-ncclx summarize` then reads
Needs no Hydra (the GPU image has none); run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS: list[tuple[str, bool, str]] = []


def record(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok, detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)


FIT_JOB = textwrap.dedent('''
    import json, os, signal, sys, time
    sys.path.insert(0, {repo!r})
    import torch
    import lightning_ncclx  # noqa: F401
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset
    from lightning_ncclx.strategies import DDPNcclxStrategy

    OUT, MODE, ACCEL, DEVICES = {out!r}, {mode!r}, {accel!r}, {devices}

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 64)
        def training_step(self, batch, batch_idx):
            if batch_idx == 3 and self.global_rank == 0:
                from lightning_ncclx.dump.traces import backends_in_use, dump_traces
                import pickle
                traces = dump_traces(stack_traces=False)
                names = {{tag: [e["profiling_name"] for e in pickle.loads(blob).get("entries", [])] for tag, blob in traces.items()}}
                with open(os.path.join(OUT, "fit.json"), "w") as f:
                    json.dump({{"setup_line": self.trainer.strategy.ncclx_setup_line(), "ops": names,
                               "backends": [b.name for b in backends_in_use()]}}, f)
            if MODE == "fit" and batch_idx == 5:
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(3.0)
            if MODE == "stall" and batch_idx == 4 and self.global_rank == 0:
                time.sleep(3600)
            return self.layer(batch[0]).pow(2).mean()
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ncclx = {{"backend": "auto", "flight_recorder": {{"dump_dir": os.path.join(OUT, "dumps")}},
             "timeouts": {{"init_timeout_seconds": 120, "training_timeout_seconds": 60, "warmup_steps": 1}},
             "watchdog": {{"first_step_seconds": 60, "train_step_seconds": 5, "validation_seconds": 30,
                          "checkpoint_seconds": 30, "poll_interval_seconds": 0.2, "auto": {{"enabled": False}},
                          "on_stall": "dump_and_exit", "collect_timeout_seconds": 20}}}}
    data = TensorDataset(torch.randn(256, 64))
    trainer = Trainer(accelerator=ACCEL, devices=DEVICES, strategy=DDPNcclxStrategy(ncclx=ncclx), max_steps=10,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=OUT)
    trainer.fit(Model(), DataLoader(data, batch_size=8))
''')

TIMEOUT_JOB = textwrap.dedent('''
    import os, sys, datetime, torch, torch.distributed as dist
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    os.environ["TORCH_FR_DUMP_ON_TIMEOUT"] = os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = {prefix!r}
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=8), device_id=torch.device("cuda", 0))
    t = torch.ones(1024, device="cuda")
    for _ in range(20):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print("queued", flush=True)
    torch.cuda._sleep(int(60 * 2e9))  # about a minute of GPU time in front of the next collective
    dist.all_reduce(t)
    torch.cuda.synchronize()
''')


def run_fit(work: Path, mode: str, accel: str, devices: int, timeout: float) -> subprocess.CompletedProcess[str]:
    script = work / f"{mode}_job.py"
    script.write_text(FIT_JOB.format(repo=str(REPO), out=str(work), mode=mode, accel=accel, devices=devices))
    return subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


def check_fit_and_on_demand(work: Path, accel: str, devices: int) -> None:
    done = run_fit(work, "fit", accel, devices, timeout=150)
    fit_file = work / "fit.json"
    if done.returncode != 0 or not fit_file.exists():
        record("fit", False, f"exit {done.returncode}: {done.stderr[-800:]}")
        return
    fit = json.loads(fit_file.read_text())
    ops = [op for names in fit["ops"].values() for op in names]
    expected = "gloo:" if accel == "cpu" else "nccl"
    recorded = [op for op in ops if op.startswith(expected)]
    record("fit", bool(recorded), f"{fit['setup_line']} | {len(recorded)} {expected}* entries, backends {fit['backends']}")
    ondemand = sorted((work / "dumps").glob("ondemand-*"))
    traces = sorted(ondemand[0].glob("rank_*.fr.pkl")) if ondemand else []
    record("on-demand", bool(traces), f"{ondemand[0] if ondemand else 'no ondemand-* folder'}: {[t.name for t in traces]}")


def check_stall(work: Path, accel: str, devices: int) -> None:
    started = time.monotonic()
    done = run_fit(work, "stall", accel, devices, timeout=150)
    stalls = sorted((work / "dumps").glob("stall-*"))
    summary = stalls[0] / "summary.json" if stalls else None
    if summary is None or not summary.exists():
        record("stall", False, f"no stall summary (exit {done.returncode}): {done.stderr[-800:]}")
        return
    data = json.loads(summary.read_text())
    from lightning_ncclx.analysis.load import load_folder

    entries = {t.lib: t.n_entries for t in load_folder(stalls[0]).traces}
    want_lib = ("nccl", "nccl2") if accel == "gpu" else ("gloo",)
    recorded = any(entries.get(lib, 0) > 0 for lib in want_lib)
    # one rank has no peer to be out of step with; with two or more the stalled rank 0 is named
    named = devices < 2 or data.get("culprit_ranks") == [0]
    record("stall", done.returncode == 75 and recorded and named,
           f"{summary} in {time.monotonic() - started:.0f} s: verdict {data.get('verdict')}, culprits {data.get('culprit_ranks')}, "
           f"entries {entries}, exit {done.returncode}")


def check_torch_timeout_dump(work: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    prefix = work / "torch_timeout" / "nccl_trace_rank_"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    script = work / "timeout_job.py"
    script.write_text(TIMEOUT_JOB.format(prefix=str(prefix), port=port))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    dump = Path(f"{prefix}0")
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not dump.exists() and proc.poll() is None:
            time.sleep(0.5)
        time.sleep(2.0)  # let torch finish writing the file
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0].decode(errors="replace")
    if not dump.exists():
        record("timeout", False, f"torch wrote no dump at {dump}: {output[-800:]}")
        return
    summarize = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(prefix.parent), "--format", "json"],
                               cwd=REPO, capture_output=True, text=True, timeout=60)
    try:
        data = json.loads(summarize.stdout)
    except json.JSONDecodeError:
        record("timeout", False, f"summarize exit {summarize.returncode}: {summarize.stderr[-800:]}")
        return
    text = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(prefix.parent)], cwd=REPO,
                          capture_output=True, text=True, timeout=60).stdout
    print(text)
    record("timeout", data.get("ranks_seen") == [0] and not data.get("unreadable"),
           f"torch's own dump {dump.name} read by summarize: verdict {data.get('verdict')}, exit {summarize.returncode}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run the flow on gloo (checks the script, not NCCL)")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    accel, devices = ("gpu", torch.cuda.device_count()) if cuda else ("cpu", 2)
    print(f"torch {torch.__version__}, {'%d GPU(s): %s' % (devices, torch.cuda.get_device_name(0)) if cuda else 'CPU (gloo) dry run'}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ncclx-gpu-check-") as tmp:
        work = Path(tmp)
        (work / "fit").mkdir()
        (work / "stall").mkdir()
        check_fit_and_on_demand(work / "fit", accel, devices)
        check_stall(work / "stall", accel, devices)
        if cuda:
            (work / "timeout").mkdir()
            check_torch_timeout_dump(work / "timeout")
        else:
            record("timeout", True, "skipped: needs CUDA (torch's NCCL watchdog)")
    print(f"\n| check | result | detail |\n|---|---|---|")
    for name, ok, detail in RESULTS:
        print(f"| {name} | {'pass' if ok else 'FAIL'} | {detail.replace('|', '/')} |")
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0 if all(ok for _, ok, _ in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
