"""The host's textfile: every fresh rank part rendered once per metric family (node_exporter
refuses a family listed twice), parsed by prometheus_client's own parser; stale and bad parts
left out; no half-written file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from lightning_ncclx.metrics.textfile import TextfileWriter, parts_folder, read_parts, render


def _snap(rank: int, **extra: object) -> dict:
    base = {"rank": rank, "local_rank": rank, "host": "node-a", "watchdog_up": 1, "global_step": 10 + rank,
            "step_seconds": 0.5, "seconds_since_heartbeat": 0.1, "phase": "train_step",
            "events": {"stall": 0, "on_demand": 1, "recovered": 0}, "dumps_written": 1, "hang_kinds": {},
            "straggler_scores": {"0": 1.0, "1": 1.4} if rank == 0 else {}}
    return {**base, **extra}


def test_two_ranks_merge_into_one_parsable_file(tmp_path: Path) -> None:
    textfile = tmp_path / "ncclx.prom"
    TextfileWriter(textfile, 5.0, lambda: [_snap(0)], 0).write()
    TextfileWriter(textfile, 5.0, lambda: [_snap(1, phase="validation")], 1).write()
    text = textfile.read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert text.count("# TYPE ncclx_global_step gauge") == 1
    steps = {s.labels["rank"]: s.value for s in families["ncclx_global_step"].samples}
    assert steps == {"0": 10.0, "1": 11.0}
    phases = {(s.labels["rank"], s.labels["phase"]) for s in families["ncclx_phase"].samples if s.value == 1.0}
    assert phases == {("0", "train_step"), ("1", "validation")}
    scores = {s.labels["scored_rank"]: s.value for s in families["ncclx_straggler_score"].samples}
    assert scores == {"0": 1.0, "1": 1.4}
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".prom"] == ["ncclx.prom"]  # no temporary left


def test_a_stale_or_bad_part_is_left_out(tmp_path: Path) -> None:
    folder = parts_folder(tmp_path / "ncclx.prom")
    folder.mkdir()
    (folder / "rank_0.json").write_text(json.dumps(_snap(0)))
    (folder / "rank_1.json").write_text(json.dumps(_snap(1)))
    old = time.time() - 3600
    os.utime(folder / "rank_1.json", (old, old))
    (folder / "rank_2.json").write_text("not json")
    (folder / "rank_3.json").write_text(json.dumps({"rank": "three"}))
    assert [s["rank"] for s in read_parts(folder, 60.0)] == [0]


def test_an_empty_host_renders_a_valid_file() -> None:
    assert list(text_string_to_metric_families(render([]).decode())) is not None


def test_a_textfile_that_cannot_be_written_costs_training_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = TextfileWriter(blocker / "sub" / "ncclx.prom", 5.0, lambda: [_snap(0)], 0)
    writer.write()  # logged once, never raised
    writer.write()
