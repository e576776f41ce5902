"""Hang detection with and without peer consensus, side by side, and a soak of healthy training.

``detect``: real fits on gloo (``tests/watchdog/jobs/train_job.py``) with steps of about 1 s
(uniform 0.9-1.1 s), every watchdog setting at its default, one rank faulty after ``--at-batch``
batches, for each strategy (``ddp_ncclx``, ``fsdp_ncclx``, ``fsdp2_ncclx``), fault and job size.
Faults: a rank stuck in compute (``stuck_train``), in its data loader (``stuck_loader``), a
skipped collective, a mismatched one (``other_collective``), a send/recv pipeline whose
middle stage never sends (``stuck_pipeline``), and a rank whose watchdog cannot run: its main
thread holds the GIL in a regex (``hold_gil``) or its process is stopped (``freeze``, SIGSTOP);
the same pipeline with its middle stage sending to the stage before (``pipeline_wrong_peer``) or
skipping one send (``pipeline_skip_send``);
``--runs`` repeats each case (p50 and p90 of fault -> summary). Under FSDP the stuck ranks' peers wait in FSDP's
own all-gathers (the job's own all_reduce is left out for those faults). Measured: seconds from
the fault (a marker file the faulty rank writes as the fault starts) to the written summary.json;
which detector started the event (consensus or step threshold); whether the summary names the
faulty rank. ``--compare-threshold`` runs each case again with consensus off (the step threshold
alone: 10 x the slowest recent step, never below 30 s).

``soak``: a healthy fit at the defaults with ``dump_and_exit`` for ``--minutes`` (60): 1 s steps,
uneven data loaders, a validation every epoch where one rank spends 3 s in a batch while the others
wait in its all_reduce, a checkpoint every epoch that rank 0 spends 4 s building while the others
wait in its barrier, an epoch-end user callback where rank 0 spends 3 s before a barrier, a 12 s
wait of rank 0 in a user callback's ``on_train_batch_end`` every 5 min (a synchronous upload) and a
10 s stall of one rank's data loader every 7 min. Counts the events, those marked recovered and
those left standing (must be 0), and the exit status (must be 0).

``probe``: what one look at "where does this rank wait" costs on the watchdog thread, in a
1-rank gloo group whose recorder holds ``--entries`` entries: ``blocked_collectives()`` (the
per-group counters, no entries) against the JSON dump of the active entries (gloo never marks an
entry completed, so that is every entry); and what the point-to-point hooks on a gloo group cost
each collective (all_reduce with and without them, interleaved).

    python bench/bench_consensus.py detect [--ranks 3,8] [--strategies ddp_ncclx,fsdp_ncclx,fsdp2_ncclx]
        [--faults stuck_train,stuck_loader,skip_collective,other_collective,stuck_pipeline,hold_gil,freeze]
        [--runs 10] [--compare-threshold] [--stop-at-summary]
    python bench/bench_consensus.py soak [--minutes 60] [--ranks 4]
    python bench/bench_consensus.py probe [--entries 20000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE.parent / "tests" / "watchdog" / "jobs" / "train_job.py"
FAULTS = ("stuck_train", "stuck_loader", "skip_collective", "other_collective", "stuck_pipeline", "hold_gil", "freeze",
          "pipeline_wrong_peer", "pipeline_skip_send")
STRATEGIES = ("ddp_ncclx", "fsdp_ncclx", "fsdp2_ncclx")
EXPECTED_CULPRIT = {"stuck_train": 1, "stuck_loader": 2, "skip_collective": 2, "other_collective": 1,
                    "stuck_pipeline": 1, "hold_gil": 1, "freeze": 2, "pipeline_wrong_peer": 1, "pipeline_skip_send": 1}
STRATEGY_WAITS_ONLY = ("stuck_train", "stuck_loader", "stuck_pipeline", "hold_gil", "freeze")
"""Faults whose peers should wait in the strategy's own collectives under FSDP (no job all_reduce)."""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_", "LIGHTNING_NCCLX",
                                                                     "MASTER_", "LOCAL_RANK", "RANK", "WORLD_SIZE"))}
    env.update(PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def detect_once(work: Path, ranks: int, fault: str, consensus: bool, at_batch: int, strategy: str,
                stop_at_summary: bool = False) -> dict:
    dump_dir, marker = work / "dumps", work / "fault-started"
    culprit = EXPECTED_CULPRIT[fault] if ranks > 2 else ranks - 1
    argv = [sys.executable, str(JOB), "--fault", fault, "--fault-rank", str(culprit), "--at-batch", str(at_batch),
            "--batches", str(at_batch + 10), "--epoch-size", str((at_batch + 12) * ranks), "--devices", str(ranks), "--dump-dir", str(dump_dir),
            "--strategy", strategy, "--step-sleep", "1.0", "--step-noise", "0.1", "--watchdog-defaults",
            "--poll-interval", "0.5", "--marker", str(marker)] + ([] if consensus else ["--no-consensus"])
    if strategy.startswith("fsdp") and fault in STRATEGY_WAITS_ONLY:
        argv.append("--no-step-collective")
    started = time.monotonic()
    summary_path = dump_dir / "stall-001" / "summary.json"
    done = _run_job(argv, work, stop_when=summary_path if stop_at_summary else None)
    ended = time.time()
    row = {"ranks": ranks, "strategy": strategy, "fault": fault, "consensus": consensus, "exit": done.returncode,
           "wall_s": round(time.monotonic() - started, 1)}
    if not summary_path.exists() or not marker.exists():
        return {**row, "error": f"no summary (exit {done.returncode}): {done.stderr[-1500:]}"}
    summary = json.loads(summary_path.read_text())
    initiator = [json.loads(p.read_text()) for p in summary_path.parent.glob("rank_*.context.json")]
    detection = next((c.get("detection") for c in initiator if c.get("reason") == "stall"), None) or {}
    return {**row, "detected_by": detection.get("by"),
            "summary_after_fault_s": round(summary_path.stat().st_mtime - marker.stat().st_mtime, 2),
            "exit_after_fault_s": None if stop_at_summary else round(ended - marker.stat().st_mtime, 1),
            "culprit_ranks": summary.get("culprit_ranks"), "expected": culprit, "hang_kind": summary.get("hang_kind"),
            "culprit_right": summary.get("culprit_ranks") == [culprit]}


def _run_job(argv: list[str], work: Path, timeout: float = 900,
             stop_when: Path | None = None) -> subprocess.CompletedProcess:
    """Run the job in its own session; afterwards kill what is left of it (a stopped rank that the
    launcher did not reap). With ``stop_when``, the job is killed 1 s after that file appears (its
    exit is then not measured)."""
    out_path, err_path = work / "job.out", work / "job.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:  # files: a rank left behind keeps no pipe open
        proc = subprocess.Popen(argv, cwd=work, env=_env(), stdout=out, stderr=err, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stop_when is not None and stop_when.exists():
                    time.sleep(1.0)  # the summary's other files, the log lines
                    break
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out_path.read_text(errors="replace"),
                                       err_path.read_text(errors="replace"))


def _p(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def detect(args: argparse.Namespace) -> list[dict]:
    rows = []
    modes = (True, False) if args.compare_threshold else (True,)
    with tempfile.TemporaryDirectory(prefix="ncclx-consensus-") as tmp:
        if args.keep is not None:  # every job's folder (dumps, job.out, job.err) stays there
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix="run-", dir=args.keep)
        for ranks in (int(r) for r in args.ranks.split(",")):
            for strategy in args.strategies.split(","):
                for fault in args.faults.split(","):
                    for run in range(args.runs):
                        for consensus in modes:  # side by side, one after the other
                            work = Path(tmp) / f"{ranks}-{strategy}-{fault}-{consensus}-{run}"
                            work.mkdir()
                            row = detect_once(work, ranks, fault, consensus, args.at_batch, strategy,
                                              args.stop_at_summary)
                            print(json.dumps(row), flush=True)
                            rows.append(row)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; steps of 0.9-1.1 s, every watchdog setting at its default")
    print("\n| ranks | strategy | fault | summary after fault (s) | job ended after fault (s), status | detected by | "
          "culprit (expected) | right | hang kind |" + (" step threshold only (s) |" if args.compare_threshold else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if args.compare_threshold else ""))
    for on in (r for r in rows if r["consensus"]):
        off = next((r for r in rows if not r["consensus"] and (r["ranks"], r["strategy"], r["fault"])
                    == (on["ranks"], on["strategy"], on["fault"])), {})
        print(f"| {on['ranks']} | {on['strategy']} | {on['fault']} | {on.get('summary_after_fault_s', 'n/a')} | "
              f"{on.get('exit_after_fault_s', 'n/a')}, {on.get('exit')} | "
              f"{on.get('detected_by')} | {on.get('culprit_ranks')} ({on.get('expected')}) | "
              f"{'yes' if on.get('culprit_right') else 'NO'} | {on.get('hang_kind')} |"
              + (f" {off.get('summary_after_fault_s', 'n/a')} |" if args.compare_threshold else ""))
    hangs = [r for r in rows if r["consensus"]]
    met = [r for r in hangs if r.get("culprit_right") and (r.get("summary_after_fault_s") or 1e9) <= args.target_s]
    print(f"\n{len(met)} of {len(hangs)} hangs summarized within {args.target_s:g} s with the right culprit")
    if args.runs > 1:
        print("\n| ranks | strategy | fault | runs | right culprit | fault -> summary p50 (s) | p90 (s) | detected by |")
        print("|---|---|---|---|---|---|---|---|")
        cases = sorted({(r["ranks"], r["strategy"], r["fault"]) for r in hangs}, key=str)
        for case in cases:
            runs = [r for r in hangs if (r["ranks"], r["strategy"], r["fault"]) == case]
            seconds = [r["summary_after_fault_s"] for r in runs if "summary_after_fault_s" in r]
            by = sorted({str(r.get("detected_by")) for r in runs})
            print(f"| {case[0]} | {case[1]} | {case[2]} | {len(runs)} | {sum(1 for r in runs if r.get('culprit_right'))} "
                  f"| {_p(seconds, 0.5)} | {_p(seconds, 0.9)} | {', '.join(by)} |")
    return rows


def soak(args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="ncclx-soak-") as tmp:
        work = Path(tmp)
        argv = [sys.executable, str(JOB), "--fault", "soak_waits", "--fault-rank", "1", "--at-batch", "0",
                "--devices", str(args.ranks), "--dump-dir", str(work / "dumps"), "--strategy", "ddp_ncclx",
                "--step-sleep", "1.0", "--step-noise", str(args.step_noise), "--watchdog-defaults",
                "--on-stall", "dump_and_exit", "--max-minutes", str(args.minutes), "--epoch-size", str(args.epoch_size),
                "--wait-every", str(args.wait_every), "--wait-seconds", str(args.wait_seconds),
                "--loader-stall-every", str(args.loader_stall_every), "--loader-stall-seconds",
                str(args.loader_stall_seconds), "--hook-seconds", "3"]
        started = time.monotonic()
        done = subprocess.run(argv, cwd=work, env=_env(), capture_output=True, text=True,
                              timeout=args.minutes * 60 + 900, start_new_session=True)
        folders = sorted(p for p in (work / "dumps").iterdir() if p.is_dir()
                         and p.name.startswith(("stall-", "ondemand-", "exception-")))
        recovered, standing = [], []
        for folder in folders:
            try:
                recovery = json.loads((folder / "collection.json").read_text()).get("recovery") or {}
            except (OSError, ValueError):
                recovery = {}
            (recovered if recovery.get("recovered") else standing).append(
                {"event": folder.name, "lasted_s": recovery.get("lasted_seconds")})
        posts = [int(n) for n in re.findall(r"consensus: (\d+) report\(s\) posted", done.stderr)]
    row = {"ranks": args.ranks, "minutes": round((time.monotonic() - started) / 60, 1), "exit": done.returncode,
           "events": len(folders), "recovered": recovered, "standing": standing,
           "hook_waits": done.stderr.count("soak: hook wait"), "loader_stalls": done.stderr.count("soak: loader stall"),
           "notices_posted_per_rank": posts, "stall_lines": done.stderr.count("stall:")}
    print(json.dumps(row))
    if done.returncode != 0:
        print(done.stderr[-3000:])
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}; "
          f"{args.ranks} ranks, {row['minutes']} min at the defaults, dump_and_exit")
    print(f"events {row['events']}: {len(recovered)} recovered, {len(standing)} standing; exit status {row['exit']}")
    return [row]


def probe(args: argparse.Namespace) -> list[dict]:
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.entries)
    import statistics as stats

    import torch
    import torch.distributed as dist

    from lightning_ncclx.backend.torch_api import dump_fr_trace_json
    from lightning_ncclx.dump.p2p_ops import TRACKER
    from lightning_ncclx.watchdog.collective_probe import blocked_collectives

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            works = [dist.all_reduce(torch.ones(1), async_op=True) for _ in range(args.entries)]
            for work in works:
                work.wait()
            cheap = []
            for _ in range(1000):
                start = time.perf_counter()
                blocked_collectives()
                cheap.append((time.perf_counter() - start) * 1e3)
            full = []
            for _ in range(5):
                start = time.perf_counter()
                dump_fr_trace_json(True, True, "gloo")
                full.append((time.perf_counter() - start) * 1e3)
            plain, hooked = _hook_cost(dist, torch, repeats=args.hook_repeats)
        finally:
            TRACKER.detach()
            dist.destroy_process_group()
    row = {"entries": args.entries, "probe_ms_median": round(stats.median(cheap), 4),
           "probe_ms_p99": round(sorted(cheap)[int(0.99 * len(cheap)) - 1], 4),
           "active_entries_json_ms_median": round(stats.median(full), 1),
           "all_reduce_us_without_p2p_hooks": round(stats.median(plain), 2),
           "all_reduce_us_with_p2p_hooks": round(stats.median(hooked), 2),
           "p2p_hooks_us_per_collective": round(stats.median(hooked) - stats.median(plain), 2),
           "ratio": round(stats.median(hooked) / stats.median(plain), 3)}
    print(json.dumps(row))
    return [row]


def _hook_cost(dist, torch, repeats: int, calls: int = 3000) -> tuple[list[float], list[float]]:
    """µs per 16-float all_reduce of a 1-rank gloo group without and with the point-to-point
    tracker's hooks on it, interleaved (medians of ``repeats`` runs of ``calls`` each)."""
    from lightning_ncclx.dump.p2p_ops import TRACKER

    t = torch.ones(16)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(t)
        return (time.perf_counter() - start) / calls * 1e6

    plain, hooked = [], []
    for _ in range(repeats):
        plain.append(run())
        assert TRACKER.attach() >= 1
        hooked.append(run())
        TRACKER.detach()
    return plain, hooked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    d = sub.add_parser("detect")
    d.add_argument("--ranks", default="3,8")
    d.add_argument("--faults", default=",".join(FAULTS))
    d.add_argument("--strategies", default=",".join(STRATEGIES))
    d.add_argument("--compare-threshold", action="store_true", help="each case again with consensus off")
    d.add_argument("--runs", type=int, default=1, help="runs of each case (p50 and p90 of fault -> summary)")
    d.add_argument("--keep", type=Path, default=None, help="keep every job's folder under this one")
    d.add_argument("--target-s", type=float, default=10.0)
    d.add_argument("--at-batch", type=int, default=25, help="after the 20-step warm-up of the learned threshold")
    d.add_argument("--stop-at-summary", action="store_true",
                   help="kill each job once its summary.json is written (faster runs; no exit time or status)")
    d.add_argument("--json", type=Path, default=None)
    s = sub.add_parser("soak")
    s.add_argument("--minutes", type=float, default=60.0)
    s.add_argument("--ranks", type=int, default=4)
    s.add_argument("--epoch-size", type=int, default=120)
    s.add_argument("--step-noise", type=float, default=0.1)
    s.add_argument("--wait-every", type=float, default=300.0, help="rank 0's hook wait every this many seconds")
    s.add_argument("--wait-seconds", type=float, default=12.0)
    s.add_argument("--loader-stall-every", type=float, default=420.0)
    s.add_argument("--loader-stall-seconds", type=float, default=10.0)
    s.add_argument("--json", type=Path, default=None)
    pr = sub.add_parser("probe")
    pr.add_argument("--entries", type=int, default=20000)
    pr.add_argument("--hook-repeats", type=int, default=7)
    pr.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = {"detect": detect, "soak": soak, "probe": probe}[args.mode](args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
