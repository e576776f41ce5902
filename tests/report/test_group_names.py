"""``report/group_names.py``: every report form (text, Markdown, HTML) names a group torch calls
"undefined" by the ranks it stands for, and the HTML timeline's rows say every rank they stand
for, checked on 1,024 synthetic ranks; the title and rewrite rules on small summaries."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.model import Summary
from lightning_ncclx.report import render_html, render_json, render_markdown, render_text
from lightning_ncclx.report.group_names import GroupNames
from lightning_ncclx.report.timeline import build_grid

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, entry, write  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_group_names")  # its tests share a costly module fixture: one worker

WORLD = 1024
CULPRIT = 1023


@pytest.fixture(scope="module")
def unnamed_group_hang(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    """1,024 gloo ranks; group 1 (made without a description: "undefined") spans them all.
    Rank 1023 never enters its all_reduce seq 1; the other 1,023 wait in it."""
    folder = tmp_path_factory.mktemp("unnamed_group_hang")
    groups = {"0": ("default_pg", list(range(WORLD))), "1": ("undefined", list(range(WORLD)))}
    for rank in range(WORLD):
        entries = collectives(3, lib="gloo")
        if rank != CULPRIT:
            entries.append(entry(3, 1, lib="gloo", pg=("1", "undefined"), state="scheduled"))
        write(folder, f"rank_{rank:05d}.gloo.fr.pkl", dump(entries, groups))
    return analyze_folder(folder, workers=1)


def _prose_of_html(page: str) -> str:
    """The page without its embedded JSON (the data keeps torch's own description)."""
    return re.sub(r'<script type="application/json" id="summary">.*?</script>', "", page, flags=re.S)


def test_the_hang_is_found(unnamed_group_hang: Summary) -> None:
    assert unnamed_group_hang.culprit_ranks == (CULPRIT,)
    assert unnamed_group_hang.process_group is not None and unnamed_group_hang.process_group.desc == "undefined"


@pytest.mark.parametrize("render", [render_text, render_markdown, lambda s: _prose_of_html(render_html(s))])
def test_every_form_names_the_group_by_its_ranks(unnamed_group_hang: Summary, render) -> None:
    out = render(unnamed_group_hang)
    assert "undefined" not in out
    assert "group 1 (ranks 0-1023, gloo)" in out
    if render is not render_text:  # the rank tables: the waiting ranks' detail, written by the analysis
        assert re.search(r"in group 1 \(ranks 0-1023\) \\?\[scheduled\\?\]", out)


def test_the_findings_of_the_json_form_name_it_the_same_way(unnamed_group_hang: Summary) -> None:
    data = json.loads(render_json(unnamed_group_hang))
    assert "of group 1 (ranks 0-1023, gloo)" in data["findings"][0]["message"]
    assert data["process_group"]["desc"] == "undefined"  # the data says what torch wrote


def test_the_timeline_row_of_the_waiting_ranks_says_it_stands_for_all_1023(unnamed_group_hang: Summary) -> None:
    grid = build_grid(unnamed_group_hang)
    assert [row.label for row in grid.rows] == [f"rank {CULPRIT}", "ranks 0-1022"]
    assert grid.rows[1].state == "waiting in all_reduce (seq 1) in group 1 (ranks 0-1023)"
    page = render_html(unnamed_group_hang)
    assert ">ranks 0-1022</div>" in page and "ranks 0-254" not in page


def _summary_with(tmp_path: Path, desc: str, declared: bool) -> Summary:
    """Rank 2 of 3 skips group 1's all_reduce; ``declared``: the dumps' pg_config lists group 1."""
    groups = {"0": ("default_pg", [0, 1, 2])} | ({"1": (desc, [0, 1, 2])} if declared else {})
    for rank in range(3):
        entries = collectives(2, lib="gloo")
        if rank != 2:
            entries.append(entry(2, 1, lib="gloo", pg=("1", desc), state="scheduled"))
        write(tmp_path, f"rank_{rank:05d}.gloo.fr.pkl", dump(entries, groups))
    return analyze_folder(tmp_path, workers=1)


def test_a_described_group_keeps_its_description(tmp_path: Path) -> None:
    names = GroupNames(_summary_with(tmp_path, "tp", declared=True))
    assert names.title("1") == "tp" and names.title("0") == "default_pg"
    assert names.rewrite("in all_reduce (seq 1) in group 1 (tp) [scheduled]") == "in all_reduce (seq 1) in group 1 (tp) [scheduled]"


def test_an_undeclared_group_is_named_by_the_ranks_whose_timelines_hold_it(tmp_path: Path) -> None:
    names = GroupNames(_summary_with(tmp_path, "undefined", declared=False))
    assert names.title("1") == "ranks 0-1"
    assert names.title("1", "pp") == "pp"
    assert names.title("9") == "ranks unknown"


@pytest.mark.parametrize(("prose", "named"), [
    ("in group 1 (undefined) [scheduled]", "in group 1 (ranks 0-2) [scheduled]"),
    ("of group 1 (undefined, gloo)", "of group 1 (ranks 0-2, gloo)"),
    ("in group 1 () [scheduled]", "in group 1 (ranks 0-2) [scheduled]"),
    ("the group 1 (undefinedness) stays", "the group 1 (undefinedness) stays"),
])
def test_rewrite_replaces_only_a_description_that_names_nothing(tmp_path: Path, prose: str, named: str) -> None:
    assert GroupNames(_summary_with(tmp_path, "undefined", declared=True)).rewrite(prose) == named


def test_a_culprit_waiting_in_an_unnamed_group_is_named_by_its_ranks_in_text_and_markdown(tmp_path: Path) -> None:
    """Rank 2 of 3 calls broadcast where the others call all_reduce, in group 1 ("undefined")."""
    groups = {"0": ("default_pg", [0, 1, 2]), "1": ("undefined", [0, 1, 2])}
    for rank in range(3):
        op = "broadcast" if rank == 2 else "all_reduce"
        entries = collectives(2, lib="gloo") + [entry(2, 1, op, lib="gloo", pg=("1", "undefined"), state="scheduled")]
        write(tmp_path, f"rank_{rank:05d}.gloo.fr.pkl", dump(entries, groups))
    summary = analyze_folder(tmp_path, workers=1)
    assert any("(undefined)" in c.detail for c in summary.findings[0].culprit_states)  # the analysis' prose
    for out in (render_text(summary), render_markdown(summary)):
        assert "undefined" not in out and "in group 1 (ranks 0-2)" in out


def test_the_hang_kinds_reason_names_the_group_as_every_other_line_does(tmp_path: Path) -> None:
    """Rank 2 waits in group 0's all_gather while the others wait in group 1's ("undefined")."""
    groups = {"0": ("default_pg", [0, 1, 2]), "1": ("undefined", [0, 1, 2])}
    for rank in range(3):
        last = (entry(2, 3, "all_gather", lib="gloo", state="scheduled") if rank == 2
                else entry(2, 1, lib="gloo", pg=("1", "undefined"), state="scheduled"))
        write(tmp_path, f"rank_{rank:05d}.gloo.fr.pkl", dump(collectives(2, lib="gloo") + [last], groups))
    summary = analyze_folder(tmp_path, workers=1)
    assert summary.classification.reason.endswith(
        "while the others wait in all_reduce (seq 1) of group 1 (ranks 0-2): it skipped, added or reordered a collective")
    assert "in group 0 (default_pg)" in summary.classification.reason
    text = render_text(summary)
    assert "undefined" not in text and "(ranks 0, 1, 2)" not in text
