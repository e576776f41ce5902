"""The report's timeline: aligned by (group, seq), centred on the divergence, rows merged."""

from __future__ import annotations

import sys
from pathlib import Path

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.report import render_html
from lightning_ncclx.report.timeline import MAX_COLUMNS, build_grid

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, write  # noqa: E402


def test_a_large_job_fits_in_a_few_rows_centred_on_the_divergence(tmp_path):
    world = 1024
    groups = {"0": ("default_pg", list(range(world)))}
    for r in range(world):
        es = collectives(40) if r == 700 else collectives(41, last_state="started")
        write(tmp_path, f"nccl_trace_rank_{r}", dump(es, groups))
    grid = build_grid(analyze_folder(tmp_path, workers=1))
    real = [c for c in grid.columns if not c.gap]
    assert len(real) <= MAX_COLUMNS and [c.seq for c in real if c.divergence] == [41]
    assert real[-1].seq == 41  # the newest collectives, not the oldest of the ring buffer
    labels = [r.label for r in grid.rows]
    assert labels[0] == "rank 700" and grid.rows[0].culprit and grid.rows[0].culprit_stop_column is not None
    assert len(grid.rows) == 2 and labels[1] == "ranks 0-699, 701-1023"  # every rank the row stands for


def test_an_undefined_group_is_named_by_its_ranks(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2]), "1": ("undefined", [1, 2])}
    sub = {"pg": ("1", "undefined")}
    for r in range(3):
        es = collectives(3, last_state="completed")
        if r == 1:
            es += [dict(e, record_id=e["record_id"] + 3) for e in collectives(1, last_state="started", **sub)]
        if r == 2:
            es += [dict(e, record_id=e["record_id"] + 3) for e in collectives(1, last_state="started", start=1)]
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(es, groups))
    page = render_html(analyze_folder(tmp_path))
    assert "ranks 1-2" in page
    assert "(undefined)" not in page.split('id="summary"')[0].split("Full report")[0]
