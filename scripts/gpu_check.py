"""GPU check of lightning-ncclx on real NCCL: one run, a few minutes, one table at the end.

    PYTHONPATH=. python scripts/gpu_check.py             # CUDA: world size = GPUs (--devices N)
    PYTHONPATH=. python scripts/gpu_check.py --cpu       # gloo, world size 1, a smaller model

Checks (each row of the table says pass, FAIL or skipped, with what was measured):
  signal-stages  the kernel's action for SIGUSR2 before and after each stage of a rank's set-up
                 (import torch, CUDA's set-up, Lightning and lightning-ncclx imported, the recorder's
                 environment, init_process_group, the first collective, a recorder dump): which
                 stage, if any, puts a handler there or takes one away
  fit            a Lightning fit with ddp_ncclx: the serving implementation, entries recorded, the
                 signal's action inside the fit after its first collectives
  sigusr2        SIGUSR2 sent to rank 0 during the fit: the rank survives it and every rank dumps
  dump-command   `lightning-ncclx dump` on the running fit: every rank dumps again (no signal)
  stall          rank 0 stuck in training_step after warm-up, the watchdog at its defaults: the kind
                 (1 rank: program_stalled; more: stuck_outside_collective, culprit rank 0), the
                 place (training_step), the verdict and exit status, and the time from the fault
                 to the first stall summary
  timeout        (CUDA) a collective queued behind a long torch.cuda._sleep: torch's NCCL watchdog
                 writes its own dump, which `lightning-ncclx summarize` then reads
  overhead       (CUDA) step time of stock `ddp` with the recorder off against `ddp_ncclx` at its
                 defaults, a bf16 model of about 30 ms steps, runs interleaved, medians and ratio
Needs no Hydra; run from the repository root (the jobs put it on their path).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS: list[tuple[str, str, str]] = []
STALL_AT = 30
ON_DEMAND_MIN_GAP_SECONDS = 5.0
"""The watchdog ignores an on-demand request this soon after its last on-demand dump."""
"""The stalled step: after the watchdog's warm-up (its learned threshold needs 20 steps)."""


def record(name: str, ok: bool | None, detail: str) -> None:
    result = "skipped" if ok is None else "pass" if ok else "FAIL"
    RESULTS.append((name, result, detail))
    print(f"[{result}] {name}: {detail}", flush=True)


def job_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "LIGHTNING_NCCLX"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SIGNAL_WORDS = textwrap.dedent('''
    def sigusr2_action():
        import signal
        from lightning_ncclx.watchdog.process_signals import handler_library, read_action
        action = read_action(signal.SIGUSR2)
        if action is None:
            return "unreadable"
        if action.handler in (0, 1):
            return ("SIG_DFL", "SIG_IGN")[action.handler]
        python = signal.getsignal(signal.SIGUSR2)
        owner = "Python's" if callable(python) else "native"
        return f"{owner} handler in {handler_library(action.handler) or hex(action.handler)}"
''')

PROBE_JOB = SIGNAL_WORDS + textwrap.dedent('''
    import json, os, sys, time
    out, cuda, port = sys.argv[1], sys.argv[2] == "cuda", int(sys.argv[3])
    stages = []
    def stage(name):
        stages.append([name, sigusr2_action()])
        print(f"SIGUSR2 after {name}: {stages[-1][1]}", flush=True)
    stage("start")
    import torch
    stage("import torch")
    if cuda:
        torch.cuda.init()
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")
        stage("CUDA set-up")
    import lightning.pytorch
    import lightning_ncclx
    stage("import lightning, lightning_ncclx")
    from pathlib import Path
    from lightning_ncclx.backend.recorder_env import apply_recorder_env
    from lightning_ncclx.config import FlightRecorderConfig
    apply_recorder_env(FlightRecorderConfig(cpp_stacks=True), Path(out) / "trace_")
    stage("recorder environment (C++ stacks on)")
    import torch.distributed as dist
    kwargs = {"device_id": torch.device("cuda", 0)} if cuda else {}
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, **kwargs)
    stage("init_process_group")
    t = torch.ones(1024, device="cuda" if cuda else "cpu")
    for _ in range(3):
        dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    stage("first collectives")
    from lightning_ncclx.dump.traces import dump_traces
    dump_traces(stack_traces=True)
    stage("a recorder dump with stacks")
    dist.destroy_process_group()
    stage("destroy_process_group")
    with open(os.path.join(out, "stages.json"), "w") as f:
        json.dump(stages, f)
''')

FIT_JOB = SIGNAL_WORDS + textwrap.dedent('''
    import json, os, signal, sys, time
    cfg = json.load(open(sys.argv[1]))
    sys.path.insert(0, cfg["repo"])
    import torch
    import torch.distributed as dist
    import lightning_ncclx  # noqa: F401 - registers the strategy names
    from lightning.pytorch import Callback, LightningModule, Trainer
    from torch.utils.data import DataLoader, Dataset

    OUT, MODE, CUDA = cfg["out"], cfg["mode"], cfg["accelerator"] == "gpu"

    class Steps(Dataset):
        def __len__(self):
            return 1_000_000
        def __getitem__(self, i):
            return i

    def saw_summary(name):
        folder = os.path.join(OUT, "dumps", name)
        return os.path.exists(os.path.join(folder, "summary.json"))

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(cfg["width"], cfg["width"]) for _ in range(cfg["layers"])])
        def training_step(self, batch, batch_idx):
            if MODE == "fit":
                self.fit_step(batch_idx)
            if MODE == "stall" and batch_idx == cfg["stall_at"] and self.global_rank == 0:
                with open(os.path.join(OUT, "fault.json"), "w") as f:
                    json.dump({"at": time.time()}, f)
                time.sleep(3600)
            x = torch.randn(cfg["tokens"], cfg["width"], device=self.device, dtype=next(self.parameters()).dtype)
            return self.net(x).float().pow(2).mean()
        def fit_step(self, batch_idx):
            if batch_idx == 3 and self.global_rank == 0:
                from lightning_ncclx.dump.traces import backends_in_use, dump_traces
                import pickle
                traces = dump_traces(stack_traces=False)
                names = {tag: [e["profiling_name"] for e in pickle.loads(blob).get("entries", [])] for tag, blob in traces.items()}
                with open(os.path.join(OUT, "fit.json"), "w") as f:
                    json.dump({"setup_line": self.trainer.strategy.ncclx_setup_line(), "ops": names,
                               "backends": [b.name for b in backends_in_use()], "sigusr2_in_fit": sigusr2_action()}, f)
            if batch_idx == 5 and self.global_rank == 0:
                os.kill(os.getpid(), signal.SIGUSR2)  # as `kill -USR2 <pid>` would
            if self.global_rank == 0 and saw_summary("ondemand-001") and not os.path.exists(os.path.join(OUT, "signal_done")):
                open(os.path.join(OUT, "signal_done"), "w").close()  # the driver now runs `lightning-ncclx dump`
            done = saw_summary("ondemand-002") or batch_idx >= cfg["max_steps"] - 2
            flag = torch.tensor([1.0 if done else 0.0], device=self.device)
            if dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if flag.item() > 0:
                self.trainer.should_stop = True
            time.sleep(cfg["step_sleep"])
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    class StepTimes(Callback):
        def __init__(self):
            self.times = []
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if CUDA:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())
        def on_train_end(self, trainer, module):
            if trainer.global_rank == 0:
                steps = [b - a for a, b in zip(self.times, self.times[1:])][cfg["warmup"]:]
                with open(os.path.join(OUT, "steps.json"), "w") as f:
                    json.dump({"step_seconds": steps}, f)

    if MODE == "overhead_ddp":
        strategy = "ddp"
    else:
        from lightning_ncclx.strategies import DDPNcclxStrategy
        ncclx = {"flight_recorder": {"dump_dir": os.path.join(OUT, "dumps")}}  # every other setting at its default
        if MODE in ("fit", "stall"):
            ncclx["watchdog"] = {"on_stall": "dump_and_exit"}
        strategy = DDPNcclxStrategy(ncclx=ncclx)
    trainer = Trainer(accelerator=cfg["accelerator"], devices=cfg["devices"], strategy=strategy,
                      precision="bf16-true" if CUDA else "32-true", max_steps=cfg["max_steps"], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[StepTimes()], default_root_dir=OUT)
    trainer.fit(Model(), DataLoader(Steps(), batch_size=1))
''')

TIMEOUT_JOB = textwrap.dedent('''
    import os, sys, datetime, torch, torch.distributed as dist
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    os.environ["TORCH_FR_DUMP_ON_TIMEOUT"] = os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = sys.argv[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1,
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


class Setup:
    def __init__(self, cuda: bool, devices: int, work: Path) -> None:
        self.cuda, self.devices, self.work = cuda, devices, work
        self.fit_script = work / "fit_job.py"
        self.fit_script.write_text(FIT_JOB)
        # GPU: a bf16 model of about 30 ms steps on an H200; CPU: small enough for a quick dry run
        self.model = ({"width": 4096, "layers": 12, "tokens": 8192} if cuda
                      else {"width": 128, "layers": 2, "tokens": 64})

    def start_fit(self, name: str, mode: str, **extra: Any) -> tuple[subprocess.Popen, Path]:
        out = self.work / name
        out.mkdir()
        cfg = {"repo": str(REPO), "out": str(out), "mode": mode, "devices": self.devices,
               "accelerator": "gpu" if self.cuda else "cpu", "max_steps": 60, "warmup": 10, "stall_at": STALL_AT,
               "step_sleep": 0.0, **self.model, **extra}
        (out / "cfg.json").write_text(json.dumps(cfg))
        env = job_env()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        if mode == "overhead_ddp":
            # stock ddp with the recorder off, under both names (an older ProcessGroupNCCL reads the old one)
            env["TORCH_FR_BUFFER_SIZE"] = env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "0"
        log = open(out / "job.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, str(self.fit_script), str(out / "cfg.json")], cwd=out, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return proc, out


def finish(proc: subprocess.Popen, seconds: float) -> int | None:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # every rank: the launcher's children share the session
        except ProcessLookupError:
            pass
        proc.wait()


def log_tail(out: Path, chars: int = 1500) -> str:
    try:
        return (out / "job.log").read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def check_signal_stages(setup: Setup) -> None:
    out = setup.work / "probe"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", PROBE_JOB, str(out), "cuda" if setup.cuda else "cpu", str(free_port())],
                          cwd=out, env=job_env(), capture_output=True, text=True, timeout=180)
    print(done.stdout, end="", flush=True)  # one line per stage
    stages_file = out / "stages.json"
    if done.returncode != 0 or not stages_file.exists():
        record("signal-stages", False, f"exit {done.returncode}: {done.stderr[-800:]}")
        return
    stages = json.loads(stages_file.read_text())
    changes = [f"{name}: {action}" for (_, before), (name, action) in zip(stages, stages[1:]) if action != before]
    record("signal-stages", True, f"start: {stages[0][1]}; " + ("; ".join(changes) if changes else
                                                                  "no stage changed it"))


def check_fit_signal_and_command(setup: Setup) -> None:
    proc, out = setup.start_fit("fit", "fit", max_steps=400, step_sleep=0.05)
    try:
        if wait_until(lambda: (out / "signal_done").exists() or proc.poll() is not None, 240) and proc.poll() is None:
            time.sleep(ON_DEMAND_MIN_GAP_SECONDS + 1)  # a request this soon after the last on-demand dump is ignored
            command = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "dump", str(out / "dumps"),
                                      "--wait", "60"], capture_output=True, text=True, timeout=120, env=job_env())
        else:
            command = None
        code = proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        finish(proc, 0)
    fit_file = out / "fit.json"
    if not fit_file.exists():
        record("fit", False, f"exit {code}, no fit.json: {log_tail(out)}")
        return
    fit = json.loads(fit_file.read_text())
    ops = [op for names in fit["ops"].values() for op in names]
    expected = "nccl" if setup.cuda else "gloo:"
    recorded = [op for op in ops if op.startswith(expected)]
    record("fit", bool(recorded), f"{fit['setup_line']} / {len(recorded)} {expected}* entries, backends "
           f"{fit['backends']}; SIGUSR2 in the fit: {fit['sigusr2_in_fit']}")
    first = sorted((out / "dumps" / "ondemand-001").glob("rank_*.context.json"))
    record("sigusr2", code == 0 and len(first) == setup.devices,
           f"exit {code} (-12: the signal ended the rank); ondemand-001: {len(first)} of {setup.devices} rank(s) dumped")
    second = sorted((out / "dumps" / "ondemand-002").glob("rank_*.context.json"))
    said = (command.stdout + command.stderr).strip() if command is not None else "not run (the fit ended first)"
    record("dump-command", command is not None and command.returncode == 0 and len(second) == setup.devices,
           f"exit {command.returncode if command else '-'}: {said} / {len(second)} of {setup.devices} rank(s) dumped")


def check_stall(setup: Setup) -> None:
    proc, out = setup.start_fit("stall", "stall", max_steps=60)
    code = finish(proc, 240)
    stalls = sorted((out / "dumps").glob("stall-*"))
    summary_file = stalls[0] / "summary.json" if stalls else None
    if summary_file is None or not summary_file.exists():
        record("stall", False, f"no stall summary (exit {code}): {log_tail(out)}")
        return
    data = json.loads(summary_file.read_text())
    fault = json.loads((out / "fault.json").read_text())["at"]
    seconds = summary_file.stat().st_mtime - fault
    text = json.dumps([data.get("hang_kind_reason"), data.get("advice"), data.get("per_rank")])
    restart = (data.get("restart_advice") or {}).get("action")
    if setup.devices == 1:  # no peer waits for it: the program itself is stuck, and a restart stops there again
        want_kind, want_exit, want_restart = "program_stalled", 76, "do_not_restart"
        verdict_ok = True
    else:  # the others wait in DDP's all_reduce for rank 0
        want_kind, want_exit, want_restart = "stuck_outside_collective", 75, "restart"
        verdict_ok = data.get("verdict") == "not_entered" and data.get("culprit_ranks") == [0]
    named = "training_step" in text
    ok = data.get("hang_kind") == want_kind and named and verdict_ok and restart == want_restart and code == want_exit
    record("stall", ok, f"kind {data.get('hang_kind')} (want {want_kind}), restart advice {restart} (want "
           f"{want_restart}), verdict {data.get('verdict')}, culprits {data.get('culprit_ranks')}, training_step "
           f"named: {named}, exit {code} (want {want_exit}); first summary {seconds:.1f} s after the fault (at step "
           f"{STALL_AT}, watchdog defaults)")


def check_torch_timeout_dump(setup: Setup) -> None:
    out = setup.work / "timeout"
    out.mkdir()
    prefix = out / "torch" / "nccl_trace_rank_"
    prefix.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", TIMEOUT_JOB, str(prefix), str(free_port())], cwd=out, env=job_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    dump = Path(f"{prefix}0")
    try:
        wait_until(lambda: dump.exists() or proc.poll() is not None, 120)
        time.sleep(2.0)  # let torch finish writing the file
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0].decode(errors="replace")
    if not dump.exists():
        record("timeout", False, f"torch wrote no dump at {dump}: {output[-800:]}")
        return
    done = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(prefix.parent), "--format",
                           "json"], cwd=REPO, capture_output=True, text=True, timeout=60, env=job_env())
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        record("timeout", False, f"summarize exit {done.returncode}: {done.stderr[-800:]}")
        return
    record("timeout", data.get("ranks_seen") == [0] and not data.get("unreadable") and done.returncode in (0, 1),
           f"torch's own dump {dump.name} read by summarize: kind {data.get('hang_kind')}, exit {done.returncode}")


def check_overhead(setup: Setup, repeats: int) -> None:
    medians: dict[str, list[float]] = {"overhead_ddp": [], "overhead_ncclx": []}
    for round_ in range(repeats):
        order = ["overhead_ddp", "overhead_ncclx"] if round_ % 2 == 0 else ["overhead_ncclx", "overhead_ddp"]
        for mode in order:
            proc, out = setup.start_fit(f"{mode}-{round_}", mode, max_steps=70)
            code = finish(proc, 300)
            steps_file = out / "steps.json"
            if code != 0 or not steps_file.exists():
                record("overhead", False, f"{mode} run {round_ + 1}: exit {code}: {log_tail(out)}")
                return
            steps = json.loads(steps_file.read_text())["step_seconds"]
            medians[mode].append(1000 * statistics.median(steps))
    ddp, ncclx = (statistics.median(medians[m]) for m in ("overhead_ddp", "overhead_ncclx"))
    runs = {m: ", ".join(f"{v:.2f}" for v in values) for m, values in medians.items()}
    record("overhead", True, f"ddp_ncclx (defaults) {ncclx:.2f} ms vs ddp (recorder off) {ddp:.2f} ms per step, "
           f"ratio {ncclx / ddp:.3f}; medians of {repeats} interleaved runs each (ddp: {runs['overhead_ddp']}; "
           f"ddp_ncclx: {runs['overhead_ncclx']}), 60 steps after 10 of warm-up per run")


def versions(cuda: bool) -> str:
    import torch

    from lightning_ncclx.backend.torch_api import nccl_version

    try:
        import lightning

        lightning_version = lightning.__version__
    except ImportError:
        lightning_version = "absent"
    where = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}" if cuda else "CPU (gloo)"
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}; lightning "
            f"{lightning_version}; NCCL {nccl_version() or '-'}; {where}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on gloo at world size 1 (checks the script, not NCCL)")
    parser.add_argument("--devices", type=int, default=None, help="GPUs to use (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each strategy for the overhead (>= 3)")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    devices = (args.devices or torch.cuda.device_count()) if cuda else 1
    header = versions(cuda)
    print(header, flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ncclx-gpu-check-") as tmp:
        setup = Setup(cuda, devices, Path(tmp))
        check_signal_stages(setup)
        check_fit_signal_and_command(setup)
        check_stall(setup)
        if cuda:
            check_torch_timeout_dump(setup)
            check_overhead(setup, max(3, args.repeats))
        else:
            record("timeout", None, "needs CUDA (torch's NCCL watchdog)")
            record("overhead", None, "needs CUDA: a CPU step time says nothing about NCCL's cost")
    print(f"\n{header}; world size {devices}; {time.monotonic() - started:.0f} s in all\n")
    print("| check | result | detail |\n|---|---|---|")
    for name, result, detail in RESULTS:
        print(f"| {name} | {result} | {detail.replace('|', '/')} |")
    return 0 if all(result != "FAIL" for _, result, _ in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
