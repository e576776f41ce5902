"""summary.json's per-rank tables past 256 ranks: the culprits' rows and one row per class of
alike ranks, every rank named in exactly one class; small jobs keep every row. render_json
writes the same document to_dict returns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synth import collectives, dump, write

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.rank_classes import FULL_TABLE_ROWS
from lightning_ncclx.analysis.rank_sets import decode
from lightning_ncclx.report import render_json

pytestmark = pytest.mark.xdist_group("test_rank_classes")  # its tests share a costly module fixture: one worker


def _job(folder: Path, world: int, culprit: int) -> None:
    groups = {"0": ("default_pg", list(range(world)))}
    for r in range(world):
        es = collectives(6, last_state="started") if r != culprit else collectives(5)
        write(folder, f"rank_{r}.pkl", dump(es, groups))


def _classed(table: list[dict]) -> list[int]:
    return [r for c in table for r in decode(c["ranks"])]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ranks300")
    _job(folder, 300, culprit=123)
    return json.loads(render_json(analyze_folder(folder)))


def test_past_256_ranks_the_rows_are_the_culprits_and_one_per_class(big: dict) -> None:
    assert big["culprit_ranks"] == "123"
    assert [row["rank"] for row in big["per_rank"]] == [0, 123]
    culprit_class, waiting = big["rank_classes"]
    assert (culprit_class["count"], culprit_class["ranks"], culprit_class["state"]) == (1, "123", "outside_collective")
    assert waiting["ranks"] == "0-122,124-299"  # past 64 ranks, every rank set is written as ranges
    assert waiting["count"] == 299 and waiting["state"] == "in_collective" and waiting["newest"]["seq"] == 6
    assert sorted(_classed(big["rank_classes"])) == list(range(300))


def test_past_256_ranks_inputs_are_classed_alike(big: dict) -> None:
    assert [i["rank"] for i in big["inputs"]] == [0, 123]
    assert [c["entries"] for c in big["input_classes"]] == [5, 6]
    assert sorted(_classed(big["input_classes"])) == list(range(300))


def test_a_small_job_keeps_every_row(tmp_path: Path) -> None:
    _job(tmp_path, 5, culprit=2)
    d = analyze_folder(tmp_path).to_dict()
    assert [row["rank"] for row in d["per_rank"]] == [0, 1, 2, 3, 4] == [i["rank"] for i in d["inputs"]]
    assert sorted(_classed(d["rank_classes"])) == [0, 1, 2, 3, 4] and 5 <= FULL_TABLE_ROWS


def test_the_json_file_is_the_documented_dict(tmp_path: Path) -> None:
    _job(tmp_path, 3, culprit=1)
    summary = analyze_folder(tmp_path)
    text = render_json(summary, {"event": "stall-001"})
    assert json.loads(text) == {**summary.to_dict(), "incident": {"event": "stall-001"}}
    assert text.startswith('{\n  "schema": "lightning-ncclx/summary/2",\n')
