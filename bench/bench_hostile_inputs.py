#!/usr/bin/env python
"""The two hostile offline inputs of docs/security.md, each beside a peer measured in the same
run, as ``lightning-ncclx summarize DIR --format json`` in a process of its own (wall time and
peak RSS from ``wait4``):

- ``giant-json``: a 200 MB JSON dump (one entries list of 385,356 collectives) beside 2 good
  5-entry dumps. Peer: ``json.loads`` of the same file in a process of its own, what any reader
  that parses it whole pays (time and memory).
- ``flat-numbers-json``: a 200 MB JSON dump of a shape torch never writes, its entries one flat
  list of 10**8 numbers, beside the same 2 good dumps. Peer: ``json.loads`` of the file.
- ``padded-json``: 200 MB whose entries are numbers padded with spaces to 256 characters, the
  smallest elements the streamed reader walks (``json_stream.MIN_ENTRY_CHARS``). Peer: ``json.loads``.
- ``declared-100k``: 3 dumps whose ``pg_config`` declares a 100,000-rank default group. Peer:
  the same 3 dumps declaring a 3-rank group.

Goals: peak RSS <= 1 GiB, <= 10 s (on the machine of the day; the ratio to the peer is what
carries over), a clear note of what was not read, the readable ranks analyzed.

    python bench/bench_hostile_inputs.py --repeat 3
    python bench/bench_hostile_inputs.py --repeat 3 --cases flat-numbers-json padded-json giant-json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "analysis"))
from synth import collectives, dump, giant_json, write  # noqa: E402

_CHILD = """
import resource, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(proc.returncode, time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.stderr.write(proc.stderr[-2000:])
"""
_JSON_PEER = "import json, sys; json.loads(open(sys.argv[1], 'rb').read())"


def _run(command: list[str]) -> tuple[int, float, int]:
    """(exit code, seconds, peak RSS bytes) of ``command`` in a process of its own."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, *command], capture_output=True, text=True, cwd=REPO)
    code, seconds, peak = proc.stdout.split()
    return int(code), float(seconds), int(peak)


def _summarize(folder: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(folder), "--format", "json",
            "--output", str(out)]


def _json_case(root: Path, name: str, fill: Callable[[Path], None]) -> tuple[list[str], list[str], Path]:
    """2 good 5-entry dumps and rank 2's JSON file written by ``fill``; the peer is json.loads of it."""
    folder = root / name
    for r in (0, 1):
        write(folder, f"rank_{r}.pkl", dump(collectives(5, last_state="started"), {"0": ("default_pg", [0, 1, 2])}))
    fill(folder / "rank_2.json")
    out = root / f"{name}.summary.json"
    return _summarize(folder, out), [sys.executable, "-c", _JSON_PEER, str(folder / "rank_2.json")], out


def _entries_of(element: bytes, megabytes: int) -> Callable[[Path], None]:
    """A dump whose entries list repeats ``element`` over ``megabytes`` MB."""
    def fill(path: Path) -> None:
        per_mb = 10**6 // (len(element) + 1)
        with open(path, "wb") as fh:
            fh.write(b'{"version": "2.10", "entries": [')
            for _ in range(megabytes):
                fh.write((element + b",") * per_mb)
            fh.write(element + b"]}")
    return fill


def _giant_json(path: Path) -> None:
    giant_json(path, 200)


def build(root: Path, names: Sequence[str]) -> dict[str, tuple[list[str], list[str], Path]]:
    """name -> (summarize command, peer command, summary path), for the cases in ``names``."""
    cases = {}
    if "giant-json" in names:
        cases["giant-json"] = _json_case(root, "giant-json", _giant_json)
    if "flat-numbers-json" in names:
        cases["flat-numbers-json"] = _json_case(root, "flat-numbers-json", _entries_of(b"0", 200))
    if "padded-json" in names:
        cases["padded-json"] = _json_case(root, "padded-json", _entries_of(b"0" + b" " * 255, 200))
    if "declared-100k" not in names:
        return cases
    for name, world in (("declared-100k", 100_000), ("declared-3", 3)):
        folder = root / name
        for r in range(3):
            es = collectives(5 if r != 2 else 4, last_state="started" if r != 2 else "completed")
            write(folder, f"rank_{r}.pkl", dump(es, {"0": ("default_pg", list(range(world)))}))
    cases["declared-100k"] = (_summarize(root / "declared-100k", root / "d100k.json"),
                              _summarize(root / "declared-3", root / "d3.json"), root / "d100k.json")
    return cases


CASES = ["giant-json", "flat-numbers-json", "padded-json", "declared-100k"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ncclx-hostile-bench-") as tmp:
        cases = build(Path(tmp), args.cases)
        rows = []
        for name, (ours, peer, summary_path) in cases.items():
            runs = []
            for _ in range(args.repeat):  # interleaved: each pair saw the same machine
                runs.append((_run(ours), _run(peer)))
            summary = json.loads(summary_path.read_text())
            seconds = [o[1] for o, _ in runs]
            ratios = [o[1] / p[1] for o, p in runs]
            rows.append({"input": name, "exit_codes": sorted({o[0] for o, _ in runs}),
                         "seconds_median": statistics.median(seconds), "seconds_max": max(seconds),
                         "peak_rss_mib": max(o[2] for o, _ in runs) / 2**20,
                         "peer_seconds_median": statistics.median(p[1] for _, p in runs),
                         "peer_peak_rss_mib": max(p[2] for _, p in runs) / 2**20,
                         "ratio_to_peer_median": statistics.median(ratios),
                         "ranks_seen": summary.get("ranks_seen"), "culprit_ranks": summary.get("culprit_ranks"),
                         "note": next((n for n in summary.get("notes", []) if "not read in full" in n), "")[:160],
                         "unreadable": [u.get("why", "")[:100] for u in summary.get("unreadable", [])]})
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, indent=2))
    print("\n| input | summarize (median, max) | peak RSS | peer | peer's peak RSS | ratio | exit | ranks seen | culprit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['input']} | {r['seconds_median']:.2f} s, {r['seconds_max']:.2f} s | {r['peak_rss_mib']:.0f} MiB | "
              f"{r['peer_seconds_median']:.2f} s | {r['peer_peak_rss_mib']:.0f} MiB | {r['ratio_to_peer_median']:.2f}x | "
              f"{r['exit_codes']} | {len(r['ranks_seen'] or [])} | {r['culprit_ranks']} |")


if __name__ == "__main__":
    main()
