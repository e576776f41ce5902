"""Seconds from an injected hang to the alert a real HTTP server receives, beside the seconds to
the summary, in the same runs.

Runs the alert tests' job (``tests/alerts/jobs/alert_job.py``: the watchdog tests' 3-rank
Lightning fit on gloo, with ``ncclx.alerts`` posting to ``tests/alerts/alert_server.py`` in its
own process). Rank 2 gets stuck in ``training_step`` and writes a marker file as it does (the
fault's time); the summary's time is ``summary.json``'s; the alert's is when the server read it.
A trigger goes out once the summary is written and the stalled heartbeat is
``ncclx.alerts.confirm_seconds`` old (4 s), or at the learned step threshold if that is shorter.
The heartbeat is the step's start, a step (1 s) before the fault: the consensus writes the
summary about 3 s after the fault, past the 4 s bar, and the alert goes out with it.

    python bench/bench_alert_latency.py [--runs 20] [--settings defaults|fast]

``defaults``: the watchdog's defaults, 1 s steps, the fault after 24 steps (the learned threshold
needs 20); ``fast``: the watchdog tests' settings (3 s step threshold, learned floor 2 s).
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
JOB = REPO / "tests" / "alerts" / "jobs" / "alert_job.py"
SERVER = REPO / "tests" / "alerts" / "alert_server.py"
SETTINGS = {
    "defaults": ["--watchdog-defaults", "--step-sleep", "1.0", "--at-batch", "24", "--batches", "60",
                 "--epoch-size", "300"],  # 300 items: 100 batches per rank of 3
    "fast": ["--step-sleep", "0.2", "--at-batch", "6", "--batches", "30"],
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCH_FR_", "TORCH_NCCL_", "LIGHTNING_NCCLX", "SLURM_", "TORCHELASTIC_"))
           and k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_run(work: Path, settings: str, server_port: int, record: Path) -> dict:
    dump_dir, marker = work / "dumps", work / "fault-started"
    env = _env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               NCCLX_TEST_WEBHOOK_URL=f"http://127.0.0.1:{server_port}/hook/{work.name}",
               NCCLX_TEST_ROUTING_KEY="bench-key",
               NCCLX_TEST_ALERTS=json.dumps({"enabled": True, "webhook": {"url_env": "NCCLX_TEST_WEBHOOK_URL"}}))
    argv = [sys.executable, str(JOB), "--fault", "stuck_train", "--fault-rank", "2", "--dump-dir", str(dump_dir),
            "--marker", str(marker), *SETTINGS[settings]]
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900, start_new_session=True)
    summary = dump_dir / "stall-001" / "summary.json"
    if not summary.exists() or not marker.exists():
        raise SystemExit(f"no summary or no fault marker (exit {done.returncode}):\n{done.stderr[-3000:]}")
    posts = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    mine = [p for p in posts if p["path"] == f"/hook/{work.name}"]
    fault = marker.stat().st_mtime
    return {"fault_to_summary_s": summary.stat().st_mtime - fault,
            "fault_to_alert_s": (min(p["time"] for p in mine) - fault) if mine else None,
            "alerts": len(mine), "exit": done.returncode}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="defaults")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ncclx-alert-bench-") as tmp:
        port_file, record = Path(tmp) / "port", Path(tmp) / "posts.jsonl"
        server = subprocess.Popen([sys.executable, str(SERVER), "--record", str(record), "--port-file", str(port_file)],
                                  env=_env(), start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            port = int(port_file.read_text())
            for run in range(args.runs):
                work = Path(tmp) / f"run{run:03d}"
                work.mkdir()
                rows.append(one_run(work, args.settings, port, record))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            server.kill()
            server.wait()
    alerted = [r for r in rows if r["fault_to_alert_s"] is not None]
    summary_s = [r["fault_to_summary_s"] for r in rows]
    alert_s = [r["fault_to_alert_s"] for r in alerted]
    gap_s = [r["fault_to_alert_s"] - r["fault_to_summary_s"] for r in alerted]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {len(rows)} runs, settings {args.settings}")
    print("\n| | p50 (s) | p90 (s) |\n|---|---|---|")
    for name, values in (("fault -> summary.json", summary_s), ("fault -> alert received", alert_s),
                         ("summary -> alert", gap_s)):
        if values:
            print(f"| {name} | {statistics.median(values):.2f} | {_quantile(values, 0.9):.2f} |")
    print(f"\nruns with exactly one alert: {sum(r['alerts'] == 1 for r in rows)} of {len(rows)}; "
          f"duplicates: {sum(max(0, r['alerts'] - 1) for r in rows)}; missing: {sum(r['alerts'] == 0 for r in rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
