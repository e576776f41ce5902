"""The per-group window of :data:`parse.TRACK_WINDOW` newest collectives: a deep buffer (the
default holds 20,000 entries) is compacted only for its newest slots, never starts inside a
coalesced slot, still finds an unfinished entry anywhere in the dump, and gives the verdicts the
whole history gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import dump, entry, write

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.analysis import parse
from lightning_ncclx.analysis.parse import MIN_TRACK_WINDOW, TRACK_WINDOW, build_trace, track_window

WORLD3 = {"0": ("default_pg", [0, 1, 2])}


def _frame(line: int, func: str) -> list:
    return [{"name": "all_reduce", "filename": "site-packages/torch/distributed/distributed_c10d.py", "line": 1},
            {"name": func, "filename": "train.py", "line": line}]


def test_a_deep_group_keeps_its_newest_window_and_its_entry_count() -> None:
    n = 2 * TRACK_WINDOW + 5
    es = [entry(i, i + 1) for i in range(n)]
    es[-1]["state"], es[-1]["retired"] = "started", False
    trace = build_trace(dump(es, WORLD3), 0, "rank_0.pkl")
    track = trace.groups["0"]
    assert len(track.seqs) == TRACK_WINDOW
    assert (track.oldest_seq, track.newest_seq) == (n - TRACK_WINDOW + 1, n)
    assert trace.n_entries == n
    assert [op.seq for op in trace.open_ops] == [n]


def test_an_unfinished_entry_older_than_the_window_is_still_an_open_op() -> None:
    n = TRACK_WINDOW + 100
    es = [entry(i, i + 1) for i in range(n)]
    es[3]["state"], es[3]["retired"] = "started", False  # a wait the newest entries do not show
    trace = build_trace(dump(es, WORLD3), 0, "rank_0.pkl")
    assert [op.seq for op in trace.open_ops] == [4]


def test_the_window_never_starts_inside_a_coalesced_slot() -> None:
    n = TRACK_WINDOW + 2
    es = [entry(i, i + 1) for i in range(n)]
    cut = n - TRACK_WINDOW  # the first entry a plain cut would keep
    es[cut]["collective_seq_id"] = es[cut - 1]["collective_seq_id"]  # two entries of one coalesced call
    for later in es[cut + 1:]:
        later["collective_seq_id"] -= 1
    trace = build_trace(dump(es, WORLD3), 0, "rank_0.pkl")
    track = trace.groups["0"]
    assert track.oldest_seq == es[cut + 1]["collective_seq_id"]  # the split slot is left out whole
    assert len(set(track.seqs)) == len(track.seqs)


def _deep_dumps(folder: Path, steps: int, extra_at: int | None = None, missing: int | None = None) -> None:
    """Three ranks, ``steps`` steps of two all_reduces (train.py:10 and :11). ``extra_at``: rank 1
    calls one more (train.py:30) at that step and runs one call ahead from there (the last one
    pending); ``missing``: that rank never enters the last collective."""
    for rank in range(3):
        lines: list[tuple[int, str]] = []
        for step in range(1, steps + 1):
            lines.append((10, "step"))
            if rank == 1 and step == extra_at:
                lines.append((30, "sync_metric"))
            lines.append((11, "step"))
        if rank == missing:
            lines.pop()
        es = []
        for i, (line, func) in enumerate(lines):
            last = i == len(lines) - 1
            pending = last and (extra_at is None and rank != missing or extra_at is not None and rank == 1)
            es.append(entry(i, i + 1, state="scheduled" if pending else "completed", frames=_frame(line, func)))
        write(folder, f"rank_{rank}.pkl", dump(es, WORLD3))


@pytest.mark.parametrize("window", [TRACK_WINDOW, 10**9], ids=["windowed", "whole"])
def test_a_rank_missing_from_the_last_collective_of_a_deep_history(tmp_path: Path, monkeypatch, window: int) -> None:
    monkeypatch.setattr(parse, "TRACK_WINDOW", window)
    _deep_dumps(tmp_path, steps=TRACK_WINDOW + 500, missing=2)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (2,), s.headline


@pytest.mark.parametrize("window", [TRACK_WINDOW, 10**9], ids=["windowed", "whole"])
def test_an_extra_collective_near_the_end_of_a_deep_history(tmp_path: Path, monkeypatch, window: int) -> None:
    monkeypatch.setattr(parse, "TRACK_WINDOW", window)
    steps = TRACK_WINDOW + 500
    _deep_dumps(tmp_path, steps=steps, extra_at=steps - 3)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.EXTRA_COLLECTIVE and s.culprit_ranks == (1,), s.headline
    assert "train.py:30 in sync_metric" in s.findings[0].message


def test_the_window_shrinks_with_the_job_size_down_to_its_floor() -> None:
    assert [track_window(n) for n in (0, 3, 1024, 2048, 4096, 8192, 16384, 65536)] == [
        TRACK_WINDOW, TRACK_WINDOW, TRACK_WINDOW, 2050, 1025, 512, MIN_TRACK_WINDOW, MIN_TRACK_WINDOW]
    assert MIN_TRACK_WINDOW == 256


def test_a_dump_of_a_16k_rank_job_compacts_its_newest_256_and_one_without_a_size_4096() -> None:
    es = [entry(i, i + 1) for i in range(2000)]
    big = build_trace(dump(es, {"0": ("default_pg", list(range(16384)))}), 5, "rank_5.pkl")
    assert len(big.groups["0"].seqs) == MIN_TRACK_WINDOW and big.groups["0"].newest_seq == 2000
    deep = [entry(i, i + 1, pg=("3", "tp")) for i in range(TRACK_WINDOW + 10)]
    unsized = build_trace(dump(deep, {"3": ("tp", [0, 1])}), 0, "rank_0.pkl")  # no default group declared
    assert len(unsized.groups["3"].seqs) == TRACK_WINDOW
