"""Offline inputs that declare or hold far more than a job has: a 200 MB JSON dump with one
giant ``entries`` list, three dumps of a declared 100,000-rank world. ``lightning-ncclx
summarize`` runs as its own process: it stays under 1 GiB (peak RSS, from ``wait4`` through a
small parent that reports its child's), exits 0 or 1 without a traceback, says on stderr and in
the notes what it did not read, and still analyzes every readable rank. The time they take is
guarded by the pytest timeout only (``docs/bench-analyzer.md`` has the figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synth import collectives, dump, giant_json, write

from lightning_ncclx.analysis.parse import MAX_ENTRIES
from lightning_ncclx.analysis.ranks import MAX_LISTED
from lightning_ncclx.analysis.rank_sets import decode

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30

_RUN = """
import resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "summarize", *sys.argv[1:]],
                      capture_output=True, text=True)
sys.stderr.write(proc.stderr)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def _summarize(folder: Path, out: Path) -> tuple[int, int, str, dict]:
    """(exit code, peak RSS in bytes, stderr, summary.json) of one ``summarize`` process."""
    proc = subprocess.run([sys.executable, "-c", _RUN, str(folder), "--format", "json", "--output", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    code, peak = map(int, proc.stdout.split())
    return code, peak, proc.stderr, json.loads(out.read_text()) if out.exists() else {}


@pytest.mark.timeout(120)
def test_a_200_mb_json_dump_is_read_newest_entries_first_within_1_gib(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in (0, 1):
        write(folder, f"rank_{r}.pkl", dump(collectives(5, last_state="started"), groups))
    held = giant_json(folder / "rank_2.json", 200)
    assert (folder / "rank_2.json").stat().st_size > 190 * 10**6
    code, peak, err, summary = _summarize(folder, tmp_path / "summary.json")
    assert code in (0, 1) and "Traceback" not in err, err
    assert peak < GIB, f"peak RSS {peak / 2**20:.0f} MiB"
    said = f"it holds {held:,} entries; the newest {MAX_ENTRIES:,} were read"
    assert said in err and any(said in n for n in summary["notes"])
    assert summary["ranks_seen"] == [0, 1, 2]
    (giant,) = [i for i in summary["inputs"] if i["rank"] == 2]
    assert giant["entries"] == held and giant["format"] == "json"


@pytest.mark.timeout(120)
def test_a_200_mb_dump_of_10_8_numbers_is_refused_and_the_other_ranks_summarized(tmp_path: Path) -> None:
    """A shape torch never writes: walking 10**8 tiny elements one by one cost ~17x json.loads of
    the file (still running after 30 s); the reader refuses it once the elements' average shows."""
    folder = tmp_path / "dumps"
    for r in (0, 1):
        write(folder, f"rank_{r}.pkl", dump(collectives(5, last_state="started"), {"0": ("default_pg", [0, 1, 2])}))
    with open(folder / "rank_2.json", "wb") as fh:
        fh.write(b'{"version": "2.10", "entries": [')
        for _ in range(100):
            fh.write(b"0," * 10**6)
        fh.write(b"0]}")
    code, peak, err, summary = _summarize(folder, tmp_path / "summary.json")
    assert code in (0, 1) and "Traceback" not in err, err
    assert peak < GIB, f"peak RSS {peak / 2**20:.0f} MiB"
    assert summary["ranks_seen"] == [0, 1]
    (why,) = [u["why"] for u in summary["unreadable"] if u["path"].endswith("rank_2.json")]
    assert why.startswith("not a flight-recorder dump: its entries list holds 4,096 elements"), why


@pytest.mark.timeout(30)  # the whole run: it took over a minute while anything was per declared rank
def test_three_dumps_of_a_declared_100k_rank_world_cost_nothing_per_declared_rank(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    world = 100_000
    groups = {"0": ("default_pg", list(range(world)))}
    for r in range(3):
        es = collectives(5 if r != 2 else 4, last_state="started" if r != 2 else "completed")
        write(folder, f"rank_{r}.pkl", dump(es, groups))
    code, peak, err, summary = _summarize(folder, tmp_path / "summary.json")
    assert code == 1 and "Traceback" not in err, err
    assert peak < GIB, f"peak RSS {peak / 2**20:.0f} MiB"
    assert decode(summary["culprit_ranks"]) == (2,) and summary["verdict"] == "not_entered"
    assert summary["ranks_seen"] == "0-2" and summary["ranks_missing"] == f"3-{world - 1}"  # ranges past 64 ranks
    missing = next(f for f in summary["findings"] if f["kind"] == "dump_missing")
    assert len(decode(missing["ranks"])) == world - 3
    assert len(missing["culprit_states"]) == len(missing["observed"]) == MAX_LISTED
    classed = [r for c in summary["rank_classes"] for r in decode(c["ranks"])]
    assert len(classed) == len(set(classed)) == sum(c["count"] for c in summary["rank_classes"])
    assert {row["rank"] for row in summary["per_rank"]} <= set(classed) and {0, 1, 2} <= set(classed)
    assert len(summary["per_rank"]) <= 64
    assert (tmp_path / "summary.json").stat().st_size < 8 << 20  # the rank numbers, not a row per rank
