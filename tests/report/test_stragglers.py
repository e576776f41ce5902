"""``report/stragglers.py``: finding ``stragglers.json`` beside an event folder, the table printed
from it (episode states, truncation, when the slow part is named), and an unreadable file
turned into one line or a count of 0.

The table of a real scored run through ``lightning-ncclx summarize`` is in
``tests/straggler/test_report.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_ncclx.report.stragglers import episode_count, find_document, render_file, render_lines


def episode(rank: int, *, open_: bool, first: int = 2, last: int = 5) -> dict:
    return {"rank": rank, "host": f"gpu-{rank}", "part": "forward", "first_interval": first, "last_interval": last,
            "score_max": 1.5, "part_ratio": 1.5, "open": open_, "message": f"rank {rank} on gpu-{rank}: forward 1.50x"}


def document(**overrides) -> dict:
    doc = {"version": 2, "written_at": "2026-09-21T14:13:20+0000", "interval_steps": 50, "threshold": 1.2,
           "patience": 3, "world_size": 4, "intervals_scored": 12, "last_interval": 11, "ranks": [], "episodes": []}
    doc.update(overrides)
    return doc


def test_the_document_is_found_in_the_run_folder_or_above_an_event_folder(tmp_path: Path) -> None:
    run = tmp_path / "ncclx_dumps" / "run-1"
    event = run / "stall-001"
    event.mkdir(parents=True)
    assert find_document(run) is None and find_document(event) is None
    (run / "stragglers.json").write_text("{}")
    assert find_document(run) == run / "stragglers.json"
    assert find_document(event) == run / "stragglers.json"
    (event / "stragglers.json").write_text("{}")
    assert find_document(event) == event / "stragglers.json"  # the event's own copy first
    dump = event / "rank_00000.gloo.fr.pkl"
    dump.write_bytes(b"")
    assert find_document(dump) == event / "stragglers.json"  # a file: look beside it
    assert find_document(tmp_path / "nothing-here") is None


def test_a_directory_named_stragglers_json_is_not_the_document(tmp_path: Path) -> None:
    (tmp_path / "stragglers.json").mkdir()
    assert find_document(tmp_path) is None


def test_header_and_open_and_recovered_episodes() -> None:
    lines = render_lines(document(episodes=[episode(3, open_=True), episode(1, open_=False, first=1, last=4)]))
    assert lines == [
        "stragglers (live detection, 12 intervals of 50 batches, threshold 1.2x for 3 intervals):",
        "  ! rank 3 on gpu-3: forward 1.50x [since interval 2, still slow]",
        "  - rank 1 on gpu-1: forward 1.50x [since interval 1, recovered after interval 4]",
    ]


def test_a_run_without_episodes_says_so() -> None:
    assert render_lines(document()) == [
        "stragglers (live detection, 12 intervals of 50 batches, threshold 1.2x for 3 intervals):",
        "  no straggler episode"]


def test_episodes_and_ranks_beyond_the_limit_are_counted_not_listed() -> None:
    doc = document(episodes=[episode(r, open_=True) for r in range(8)],
                   ranks=[{"rank": r, "host": f"gpu-{r}", "score": 1.0, "slow_part": "forward"} for r in range(8)])
    lines = render_lines(doc, most=3)
    assert sum(line.startswith("  ! rank") for line in lines) == 3
    assert "  ... 5 more episodes in stragglers.json" in lines
    assert sum(line.startswith("    rank ") for line in lines) == 3


def test_the_slow_part_is_named_only_for_a_rank_above_the_threshold() -> None:
    ranks = [{"rank": 5, "host": "gpu-5", "score": 1.4, "slow_part": "data_fetch", "part_ratios": {"data_fetch": 2.345}},
             {"rank": 2, "host": "gpu-2", "score": 1.2, "slow_part": "forward", "part_ratios": {"forward": 1.2}},
             {"rank": 0, "host": "gpu-0", "score": 0.98, "slow_part": "optimizer"}]
    lines = render_lines(document(ranks=ranks))
    assert lines[-4:] == [
        "  slowest ranks in interval 11 (work over the median of the peers):",
        "    rank 5 on gpu-5: 1.40x; most excess in data fetch (2.35x)",
        "    rank 2 on gpu-2: 1.20x",  # at the threshold is not above it
        "    rank 0 on gpu-0: 0.98x",
    ]


@pytest.mark.parametrize("version", [3, None, "2"])
def test_an_unknown_format_version_renders_nothing(version) -> None:
    assert render_lines(document(version=version, episodes=[episode(1, open_=True)])) == []


def test_a_version_1_file_keeps_its_episodes_under_incidents(tmp_path: Path) -> None:
    old = document(version=1, incidents=[episode(3, open_=True)])
    del old["episodes"]
    assert render_lines(old)[1] == "  ! rank 3 on gpu-3: forward 1.50x [since interval 2, still slow]"
    path = tmp_path / "stragglers.json"
    path.write_text(json.dumps(old))
    assert episode_count(path) == 1


def test_render_file_reads_a_document(tmp_path: Path) -> None:
    path = tmp_path / "stragglers.json"
    path.write_text(json.dumps(document(episodes=[episode(3, open_=True)])))
    assert render_file(path) == ("stragglers (live detection, 12 intervals of 50 batches, threshold 1.2x for 3 intervals):\n"
                                 "  ! rank 3 on gpu-3: forward 1.50x [since interval 2, still slow]\n")


@pytest.mark.parametrize(("content", "why"), [
    ("[1, 2]", "not a JSON object"),
    ("{\"version\": 1,", "Expecting"),
    (json.dumps(document(episodes=5)), "'int' object is not subscriptable"),
])
def test_an_unreadable_file_is_one_line_saying_why(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "stragglers.json"
    path.write_text(content)
    out = render_file(path)
    assert out.startswith(f"stragglers: {path} is unreadable (") and why in out and out.endswith(")\n")
    assert out.count("\n") == 1


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "stragglers.json"
    os.mkfifo(path)
    assert render_file(path) == f"stragglers: {path} is unreadable (stragglers.json is a FIFO, not a regular file: not read)\n"
    assert episode_count(path) == 0


@pytest.mark.parametrize(("doc", "count"), [
    (document(episodes=[episode(1, open_=True), episode(2, open_=False)]), 2),
    (document(), 0),
    (document(episodes=None), 0),
    (document(episodes={"rank": 1}), 0),  # not a list
    ([], 0),
])
def test_episode_count(tmp_path: Path, doc, count: int) -> None:
    path = tmp_path / "stragglers.json"
    path.write_text(json.dumps(doc))
    assert episode_count(path) == count
    assert episode_count(tmp_path / "missing.json") == 0
