#!/usr/bin/env python
"""Time ``lightning-ncclx summarize`` against its floor and torch's ``torchfrtrace`` on the same synthetic dumps.

For each world size: N pickles named ``nccl_trace_rank_<r>`` (what torchfrtrace reads), torch's
format 2.10, legacy-NCCL-like (``nccl:all_reduce``/``all_gather``/``broadcast``, valid
``pg_config``, 3-5 ``frames`` per entry), ENTRIES entries per rank; rank N//3 never entered the
last all_reduce (one injected culprit). Each tool runs as a child process; wall time and peak RSS
(largest process, from ``wait4``) are measured, runs of the tools interleaved, medians reported;
a run past ``--cap`` seconds is killed.

The floor: plain ``pickle.loads`` of the same files (read, unpickled, freed) in as many forked
processes as ``summarize`` uses (every core this process may use, at most 16), nothing else. The
ratio ``summarize / floor`` is what the targets are about (absolute times on a shared machine move
~3x between days; the ratio of two interleaved runs does not).

    .venv/bin/python bench/bench_analyzer.py                      # 64, 256, 1024 ranks x 2000, 3 runs each
    .venv/bin/python bench/bench_analyzer.py --sizes 64,256 --cap 120 --repeat 5
    .venv/bin/python bench/bench_analyzer.py --sizes 1024x20000,16384x2000 --repeat 2 \
        --theirs-max-entries 0 --delete-after                     # the scale targets (1.5x the floor)

A size is ``RANKS`` (with ``--entries`` per rank) or ``RANKSxENTRIES``. torchfrtrace is not run
where ranks x entries exceeds ``--theirs-max-entries`` (it holds ~1.9 KiB per entry: 3.8 GiB at
1024 x 2000, so 16384 x 2000 would need ~60 GiB); the table says so.

Dumps go to a temporary folder (``--root``), never into the repository; delete it when done
(``--delete-after`` removes each size's dumps once it is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import lightning_ncclx.analysis.rank_sets as rank_sets  # noqa: E402
T0 = 1_796_000_000_000_000_000
OPS = ("all_reduce", "all_reduce", "all_reduce", "all_gather", "broadcast")
FRAMES = [
    [{"name": "all_reduce", "filename": "site-packages/torch/distributed/distributed_c10d.py", "line": 3068},
     {"name": "wrapper", "filename": "site-packages/torch/distributed/c10d_logger.py", "line": 83},
     {"name": "reduce_gradients", "filename": "train/ddp.py", "line": 120 + k},
     {"name": "training_step", "filename": "train/loop.py", "line": 40 + k},
     {"name": "<module>", "filename": "train/main.py", "line": 12}] for k in range(len(OPS))]


def make_entries(rank: int, world: int, entries: int, culprit: int, rng: random.Random) -> list[dict]:
    out = []
    last = entries if rank != culprit else entries - 1
    for i in range(last):
        seq = i + 1
        k = i % len(OPS)
        n = 1 << (10 + k)
        out_sizes = [[n * world]] if OPS[k] == "all_gather" else [[n]]
        final = i == entries - 1
        out.append({
            "frames": FRAMES[k], "record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"),
            "thread_name": "pt_main_thread", "thread_id": "140692137763136", "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{OPS[k]}",
            "time_created_ns": T0 + seq * 5_000_000 + rng.randrange(0, 200_000) + (300_000 if rank == 7 else 0),
            "input_sizes": [[n]], "input_dtypes": ["Float"], "output_sizes": out_sizes, "output_dtypes": ["Float"],
            "state": "started" if final else "completed", "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None if final else T0 + seq * 5_000_000 + 900_000,
            "retired": not final, "timeout_ms": 600000, "is_p2p": False,
        })
    return out


VARIANTS = 8
"""Healthy ranks share one of this many dumps (their creation times jittered differently): the
analyzer cannot tell, and generating 16k ranks takes seconds instead of an hour."""


def _dump_bytes(world: int, entries: int, rank: int) -> bytes:
    rng = random.Random(world * 100_003 + rank)
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    dump = {"version": "2.10", "pg_config": pg_config, "comm_lib_version": "2.28.9",
            "pg_status": {"0": {"last_enqueued_collective": entries, "last_started_collective": -1,
                                "last_completed_collective": entries - 1}},
            "entries": make_entries(rank, world, entries, world // 3, rng)}
    return pickle.dumps(dump, protocol=4)


def generate(folder: Path, world: int, entries: int) -> None:
    """One pickle per rank: the culprit (``world // 3``) and the late rank 7 their own, every other
    rank one of ``VARIANTS`` shared dumps (rank r: variant r % VARIANTS)."""
    marker = folder / ".complete"
    if marker.exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    special = {world // 3, 7}
    variants = [_dump_bytes(world, entries, v) for v in range(VARIANTS) if v not in special]
    for rank in range(world):
        data = _dump_bytes(world, entries, rank) if rank in special else variants[rank % len(variants)]
        (folder / f"nccl_trace_rank_{rank}").write_bytes(data)
    marker.touch()


def warm_page_cache(folder: Path) -> None:
    """Read every dump once before the first round, so that the first tool to run does not pay
    for reading from disk what the others then find in memory (the sets are GiBs)."""
    for path in sorted(folder.glob("nccl_trace_rank_*")):
        with open(path, "rb") as fh:
            while fh.read(1 << 20):
                pass


def run_child(cmd: list[str], cap_s: float, cwd: Path = REPO) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    deadline = start + cap_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            return {"seconds": None, "peak_rss_mib": None, "rc": None, "note": f"killed after {cap_s:.0f} s"}
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    return {"seconds": time.perf_counter() - start, "peak_rss_mib": usage.ru_maxrss / 1024, "rc": proc.returncode,
            "cpu_s": usage.ru_utime + usage.ru_stime,  # the child and the processes it waited for (its workers)
            "note": err.strip().splitlines()[-1][:100] if proc.returncode not in (0, 1) and err.strip() else ""}


def _unpickle_file(path: str) -> int:
    """The floor's work on one file: read it, unpickle it, free it."""
    import gc

    gc.disable()  # as the analyzer's readers do: a dump is acyclic
    with open(path, "rb") as fh:
        data = pickle.loads(fh.read())
    del data
    return 0


def floor_main(folder: Path) -> int:
    """Plain ``pickle.loads`` of every dump in ``folder`` in as many forked processes as
    ``summarize`` uses (``lightning_ncclx.analysis.load.default_workers``: every core this
    process may use, at most 16), 16 files per task."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    files = sorted(str(folder / n) for n in os.listdir(folder) if n.startswith("nccl_trace_rank_"))
    workers = max(1, min(len(os.sched_getaffinity(0)), 16))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return sum(pool.map(_unpickle_file, files, chunksize=16))


def _floor(folder: Path, cap_s: float) -> dict:
    return run_child([sys.executable, str(Path(__file__).resolve()), "--floor-of", str(folder)], cap_s)


def _summarize(folder: Path, out_json: Path, cap_s: float, code_dir: Path) -> dict:
    """One ``summarize`` run of the package found in ``code_dir`` (cwd goes first on sys.path)."""
    return run_child([sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(folder), "--format", "json",
                      "--output", str(out_json)], cap_s, cwd=code_dir)


def _median(runs: list[dict]) -> dict:
    """Median wall time and median peak RSS over the runs (None when any run was killed)."""
    done = [r for r in runs if r["seconds"] is not None]
    if len(done) < len(runs):
        return next(r for r in runs if r["seconds"] is None) | {"runs": [r["seconds"] for r in runs]}
    return {"seconds": statistics.median(r["seconds"] for r in done),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in done),
            "cpu_s": statistics.median(r["cpu_s"] for r in done),
            "rc": done[0]["rc"], "note": done[0]["note"], "runs": [round(r["seconds"], 2) for r in done]}


def bench_size(root: Path, world: int, entries: int, cap_s: float, repeat: int, baseline: Path | None,
               theirs_max_entries: int) -> dict:
    folder = root / f"ranks{world}_entries{entries}"
    t = time.perf_counter()
    generate(folder, world, entries)
    size_mib = sum(p.stat().st_size for p in folder.glob("nccl_trace_rank_*")) / 2**20
    out_json = root / f"summary_{world}x{entries}.json"
    out_json.unlink(missing_ok=True)
    ours, floor, theirs, before = [], [], [], []
    run_theirs = world * entries <= theirs_max_entries
    warm_page_cache(folder)
    for round_ in range(repeat):  # interleaved, so every tool sees the same background load
        if round_ % 2:  # whichever runs first meets the files the last run left out of the page cache
            floor.append(_floor(folder, cap_s))
            ours.append(_summarize(folder, out_json, cap_s, REPO))
        else:
            ours.append(_summarize(folder, out_json, cap_s, REPO))
            floor.append(_floor(folder, cap_s))
        if run_theirs:
            theirs.append(run_child([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                                     str(folder), "-p", "nccl_trace_rank_"], cap_s))
        if baseline is not None:
            before.append(_summarize(folder, root / f"summary_{world}x{entries}_before.json", cap_s, baseline))
    if not run_theirs:
        theirs = [{"seconds": None, "peak_rss_mib": None, "rc": None,
                   "note": f"not run: ~{world * entries * 1.9 / 2**20:.0f} GiB at 1.9 KiB per entry"}]
    culprits = (list(rank_sets.decode(json.loads(out_json.read_text())["culprit_ranks"]))  # ranges past 64 ranks
                if out_json.exists() else None)
    row = {"ranks": world, "entries": entries, "dump_mib": round(size_mib, 1), "generate_s": time.perf_counter() - t,
           "ours": _median(ours), "ours_culprits": culprits, "expected_culprit": world // 3,
           "summary_json_mib": round(out_json.stat().st_size / 2**20, 2) if out_json.exists() else None,
           "floor": _median(floor), "ratios": _ratios(ours, floor), "cpu_ratios": _ratios(ours, floor, "cpu_s"),
           "torchfrtrace": _median(theirs)}
    if before:
        row["before"] = _median(before)
        row["before_ratios"] = _ratios(before, floor)
    return row


def _ratios(runs: list[dict], floor: list[dict], key: str = "seconds") -> list[float | None]:
    """Per repeat: a tool's wall time (or ``cpu_s``) over the floor's in the same round (the runs
    next to each other)."""
    return [round(r[key] / f[key], 2) if r.get(key) and f.get(key) else None for r, f in zip(runs, floor)]


def _ratio_text(ratios: list[float | None]) -> str:
    known = [r for r in ratios if r is not None]
    if not known:
        return "-"
    return f"{statistics.median(known):.2f}x" + (f" ({', '.join(f'{r:.2f}' for r in known)})" if len(known) > 1 else "")


def _fmt(r: dict) -> str:
    return "-" if r["seconds"] is None else f"{r['seconds']:.2f}"


def _speed(o: dict, t: dict) -> str:
    if o["seconds"] and t["seconds"]:
        return f"{t['seconds'] / o['seconds']:.1f}x"
    if o["seconds"] and t["seconds"] is None and t["note"].startswith("killed"):
        return f"> {float(t['note'].split()[2]) / o['seconds']:.0f}x"
    return "?"


def table(rows: list[dict]) -> str:
    """Markdown: medians of the interleaved runs; speed-up = torchfrtrace median / summarize median."""
    has_before = any("before" in r for r in rows)
    head = ("| ranks x entries | dumps (MiB) | summarize (s) | peak RSS (MiB) | floor (s) | summarize / floor | "
            "CPU: summarize / floor | summary.json (MiB) | culprit found | torchfrtrace (s) | peak RSS (MiB) | speed-up |")
    rule = "|---|---|---|---|---|---|---|---|---|---|---|---|"
    if has_before:
        head += " before: summarize (s) | before: peak RSS (MiB) | before / floor |"
        rule += "---|---|---|"
    lines = [head, rule]
    for r in rows:
        o, t = r["ours"], r["torchfrtrace"]
        ok = "yes" if r["ours_culprits"] == [r["expected_culprit"]] else f"no ({r['ours_culprits']})"
        fl = r.get("floor") or {"seconds": None}
        line = (f"| {r['ranks']} x {r['entries']} | {r['dump_mib']} | {_fmt(o)} | "
                f"{o['peak_rss_mib'] and round(o['peak_rss_mib'])} | {_fmt(fl)} | {_ratio_text(r.get('ratios', []))} | "
                f"{_ratio_text(r.get('cpu_ratios', []))} | "
                f"{r.get('summary_json_mib')} | {ok} | "
                f"{_fmt(t)}{' (' + t['note'] + ')' if t['note'] else ''} | "
                f"{t['peak_rss_mib'] and round(t['peak_rss_mib'])} | {_speed(o, t)} |")
        if has_before:
            b = r.get("before") or {"seconds": None, "peak_rss_mib": None}
            line += (f" {_fmt(b)} | {b['peak_rss_mib'] and round(b['peak_rss_mib'])} | "
                     f"{_ratio_text(r.get('before_ratios', []))} |")
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024",
                        help="comma-separated world sizes, each RANKS or RANKSxENTRIES")
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--cap", type=float, default=600.0, help="seconds per tool run before it is killed")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per tool; the table shows medians")
    parser.add_argument("--theirs-max-entries", type=int, default=4_200_000,
                        help="run torchfrtrace only where ranks x entries is at most this (its memory)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also time the lightning_ncclx package in this folder (e.g. an older commit's "
                             "`git archive REV lightning_ncclx | tar -x -C DIR`)")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "lightning-ncclx-bench-analyzer",
                        help="where dumps are generated (kept between runs; ~380 MiB for 64+256+1024 ranks) "
                             "and results written")
    parser.add_argument("--plot", type=Path, default=None, help="write the scaling plot (PNG) here")
    parser.add_argument("--from-results", type=Path, default=None,
                        help="only print the table and plot from an earlier results.json")
    parser.add_argument("--delete-after", action="store_true",
                        help="delete each size's generated dumps once it is measured (16384 x 2000: 6 GiB)")
    parser.add_argument("--floor-of", type=Path, default=None, help=argparse.SUPPRESS)  # the floor's child process
    args = parser.parse_args(argv)
    if args.floor_of is not None:
        return floor_main(args.floor_of)
    if args.from_results is not None:
        rows = json.loads(args.from_results.read_text())
        print(table(rows))
        if args.plot:
            plot(rows, args.plot)
        return 0
    rows = []
    for size in (s.strip() for s in args.sizes.split(",") if s.strip()):
        world, _, entries = size.partition("x")
        rows.append(bench_size(args.root, int(world), int(entries or args.entries), args.cap, max(1, args.repeat),
                               args.baseline, args.theirs_max_entries))
        print(json.dumps(rows[-1]), flush=True)
        if args.delete_after:
            shutil.rmtree(args.root / f"ranks{world}_entries{int(entries or args.entries)}", ignore_errors=True)
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; medians of {args.repeat} interleaved runs\n")
    print(table(rows))
    (args.root / "results.json").write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


TARGETS = {(16384, 2000): (60.0, 2048.0), (1024, 20000): (30.0, None)}
"""The scale targets (seconds, MiB) this benchmark checks: docs/bench-analyzer.md."""
FLOOR_TARGET = 1.5
"""At both scale shapes, ``summarize`` within this factor of the floor, measured in the same run."""


def plot(rows: list[dict], path: Path) -> None:
    """Time and peak memory of ``summarize`` against ranks x entries (log-log), targets marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import FuncFormatter, NullFormatter

    done = sorted((r for r in rows if r["ours"]["seconds"] is not None), key=lambda r: r["ranks"] * r["entries"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, unit in ((left, "seconds", "s"), (right, "peak_rss_mib", "MiB")):
        xs = [r["ranks"] * r["entries"] for r in done]
        ys = [r["ours"][key] for r in done]
        ax.loglog(xs, ys, "o-", label="lightning-ncclx summarize")
        theirs = [(r["ranks"] * r["entries"], r["torchfrtrace"][key]) for r in rows if r["torchfrtrace"][key]]
        if theirs:
            ax.loglog(*zip(*theirs), "s--", label="torchfrtrace")
        for r, x, y in zip(done, xs, ys):
            ax.annotate(f"{r['ranks']}x{r['entries']}", (x, y), textcoords="offset points", xytext=(4, -12),
                        fontsize=8)
        for (ranks, entries), (t_s, t_mib) in TARGETS.items():
            target = t_s if key == "seconds" else t_mib
            if target is not None:
                ax.plot([ranks * entries], [target], "rv", label=f"target {ranks}x{entries}")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.set_xlabel("ranks x entries per rank")
        ax.set_ylabel(f"{'wall time' if key == 'seconds' else 'peak RSS, largest process'} ({unit})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"summarize on {os.cpu_count()} cores (generated NCCL-like dumps, one culprit)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
