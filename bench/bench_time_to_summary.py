"""Seconds from a stall's threshold to every rank's dump and to the written summary.

Runs the fault job of the watchdog tests (``tests/watchdog/jobs/train_job.py``: a real Lightning
``ddp_ncclx`` fit on gloo) with the last rank stuck in ``training_step``, at 2, 4 and 8 ranks.
Reference point: the earliest moment any rank's threshold passed (its last heartbeat plus its
threshold, both from its ``context.json``). Goal: summary within threshold + 5 s.

    python bench/bench_time_to_summary.py [--ranks 2,4,8] [--repeats 2] [--settings 0.5:20000,0.2:0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE.parent / "tests" / "watchdog" / "jobs" / "train_job.py"


def one_run(ranks: int, work: Path, poll: float = 0.5, prefill: int = 0) -> dict:
    dump_dir = work / f"dumps-{ranks}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_", "LIGHTNING_NCCLX"))}
    env["PYTHONPATH"] = str(HERE.parent)
    argv = [sys.executable, str(JOB), "--fault", "stuck_train", "--fault-rank", str(ranks - 1), "--at-batch", "4",
            "--devices", str(ranks), "--dump-dir", str(dump_dir), "--strategy", "ddp_ncclx", "--batches", "8",
            "--poll-interval", str(poll), "--prefill", str(prefill)]
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
    folder = dump_dir / "stall-001"
    if not (folder / "summary.json").exists():
        raise SystemExit(f"no summary at {ranks} ranks (exit {done.returncode}):\n{done.stderr[-3000:]}")
    contexts = [json.loads(p.read_text()) for p in folder.glob("rank_*.context.json")]
    crossing = min(c["time_unix"] - c["seconds_since_heartbeat"] + c["stall_threshold_seconds"] for c in contexts)
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "ranks": ranks,
        "threshold_s": min(c["stall_threshold_seconds"] for c in contexts),
        "last_dump_after_threshold_s": max(c["time_unix"] for c in contexts) - crossing,
        "summary_after_threshold_s": (folder / "summary.json").stat().st_mtime - crossing,
        "ranks_dumped": len(contexts),
        "culprit_ranks": summary.get("culprit_ranks"),
        "verdict": summary.get("verdict"),
        "entries": max((i.get("entries") or 0 for i in summary.get("inputs") or []), default=0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", default="0.5:20000,0.2:0",
                        help="POLL:PREFILL pairs, run side by side: the watchdog's poll interval and the "
                             "collectives each rank runs first to fill its recorder (0.5:20000 = the defaults "
                             "with a full 20,000-entry buffer; 0.2:0 = the earlier figures' settings)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    settings = [(float(p), int(n)) for p, _, n in (x.partition(":") for x in args.settings.split(",") if x)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ncclx-tts-") as tmp:
        for ranks in (int(r) for r in args.ranks.split(",")):
            runs: dict[tuple, list] = {s: [] for s in settings}
            for repeat in range(args.repeats):
                for poll, prefill in settings:  # interleaved: the same background load for each
                    work = Path(tmp) / f"{ranks}-{repeat}-{poll}-{prefill}"
                    work.mkdir()
                    runs[(poll, prefill)].append(one_run(ranks, work, poll, prefill))
            for (poll, prefill), done in runs.items():
                rows.append({**done[0], "poll_s": poll, "prefill": prefill,
                             "last_dump_after_threshold_s": statistics.median(r["last_dump_after_threshold_s"]
                                                                              for r in done),
                             "summary_after_threshold_s": statistics.median(r["summary_after_threshold_s"]
                                                                            for r in done),
                             "runs": done})
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; median of {args.repeats} runs each")
    print("\n| ranks | poll (s) | entries per rank | threshold (s) | every rank dumped (s after threshold) | "
          "summary written (s after threshold) | culprit |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['ranks']} | {row['poll_s']} | {row['entries']} | {row['threshold_s']:.1f} | "
              f"{row['last_dump_after_threshold_s']:.2f} | {row['summary_after_threshold_s']:.2f} | "
              f"{row['verdict']} {row['culprit_ranks']} (expected [{row['ranks'] - 1}]) |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
