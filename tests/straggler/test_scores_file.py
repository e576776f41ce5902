"""stragglers.json: written by the reading rank, shown by ``lightning-ncclx summarize`` below a hang
summary, or alone for a run that never hung."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, write  # noqa: E402

from lightning_ncclx.cli import main  # noqa: E402
from lightning_ncclx.report.stragglers import find_document  # noqa: E402
from lightning_ncclx.straggler.scores_file import build_document, write_document  # noqa: E402
from lightning_ncclx.straggler.scoring import EpisodeTracker, score_interval  # noqa: E402
from lightning_ncclx.straggler.timings import IntervalSummary  # noqa: E402


def run_folder(folder: Path, slow: bool) -> Path:
    tracker = EpisodeTracker(threshold=1.2, patience=2, interval_steps=10)
    scores = None
    for i in range(3):
        forward = [0.13 if (slow and r == 5) else 0.1 for r in range(8)]
        scores = score_interval([IntervalSummary(rank=r, interval=i, host=f"gpu-{r}", batches=10,
                                                 parts={"data_fetch": 0.001, "forward": forward[r], "optimizer": 0.001})
                                 for r in range(8)])
        assert scores is not None
        tracker.update(scores)
    write_document(folder, build_document(scores=scores, episodes=tracker.episodes, intervals_scored=3,
                                          interval_steps=10, threshold=1.2, patience=2, world_size=8))
    return folder


def test_run_without_a_hang_prints_the_table_and_exits_1_on_an_episode(tmp_path: Path, capsys) -> None:
    folder = run_folder(tmp_path / "run", slow=True)
    assert main(["summarize", str(folder)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("stragglers (live detection, 3 intervals of 10 batches")
    assert "! rank 5 on gpu-5: forward 1.30x the median for 2 intervals" in out
    assert "rank 5 on gpu-5: 1.30x; most excess in forward (1.30x)" in out  # forward scored alone


def test_healthy_run_exits_0(tmp_path: Path, capsys) -> None:
    folder = run_folder(tmp_path / "run", slow=False)
    assert main(["summarize", str(folder)]) == 0
    assert "no straggler episode" in capsys.readouterr().out


def test_hang_summary_of_an_event_folder_is_followed_by_the_run_table(tmp_path: Path, capsys) -> None:
    run = run_folder(tmp_path / "run", slow=True)
    groups = {"0": ("default_pg", [0, 1])}
    event = run / "stall-001"
    write(event, "nccl_trace_rank_0", dump(collectives(5, last_state="started"), groups))
    write(event, "nccl_trace_rank_1", dump(collectives(4), groups))
    assert find_document(event) == run / "stragglers.json"
    assert main(["summarize", str(event)]) == 1
    out = capsys.readouterr().out
    assert out.index("HANG:") < out.index("stragglers (live detection") and "rank 5 on gpu-5" in out
    assert main(["summarize", str(event), "--format", "json"]) == 1
    assert "stragglers (live" not in capsys.readouterr().out  # the JSON report keeps its schema
    json.loads((run / "stragglers.json").read_text())
