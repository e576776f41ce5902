"""``report/text.py``: the rules of the plain-text and Markdown reports - rank lists shortened past
16, the rank table limited but never without a culprit, the one-line input tally (plurals, why
files were skipped), the hang-kind lines, what the header holds for a hang and for no hang, and
the caps on long lists.

Summaries come from the real analyzer on tiny synthetic dumps (``tests/analysis/synth.py``),
with single fields replaced where a rule needs an input the dumps cannot easily give. The
report's overall shape and the escaping of hostile file names are in
``tests/report/test_report.py`` and ``tests/analysis/test_hostile.py``."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.kind import Classification, HangKind, RestartAction
from lightning_ncclx.analysis.model import Duplicate, RankRow, Summary, Unreadable, Verdict
from lightning_ncclx.report.text import _ranks, display_rows, input_tally, kind_lines, render_markdown, render_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, cross_group_deadlock, dump, write  # noqa: E402


@pytest.fixture
def hung(tmp_path: Path) -> Summary:
    """Rank 1 of 3 never entered all_reduce seq 31."""
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in range(3):
        write(tmp_path / "d", f"rank_{r:05d}.nccl.fr.pkl",
              dump(collectives(30 if r == 1 else 31, last_state="completed" if r == 1 else "started"), groups))
    return analyze_folder(tmp_path / "d")


@pytest.fixture
def healthy(tmp_path: Path) -> Summary:
    for r in range(2):
        write(tmp_path / "h", f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(5), {"0": ("default_pg", [0, 1])}))
    return analyze_folder(tmp_path / "h")


def test_rank_lists_up_to_16_are_written_out_longer_ones_shortened_with_a_count() -> None:
    assert _ranks([]) == ""
    assert _ranks(tuple(range(16))) == ", ".join(map(str, range(16)))
    assert _ranks(list(range(100, 117))) == "100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, ... (17)"


def row(rank: int) -> RankRow:
    return RankRow(rank=rank, host=None, state="in_collective", detail="", location=None)


def test_display_rows_keep_every_culprit_within_the_limit_in_rank_order() -> None:
    base = Summary(source="x", verdict=Verdict.NOT_ENTERED, culprit_ranks=(), process_group=None, collective_seq_id=None, op=None, waiting_ranks=(), findings=(),
                   notes=(), unreadable=(), ranks_seen=(), ranks_missing=(), hosts={}, dump_locations={}, stragglers=(),
                   per_rank=tuple(row(r) for r in range(1000)), context={})
    chosen = display_rows(dataclasses.replace(base, culprit_ranks=(700, 999)), 5)
    assert [r.rank for r in chosen] == [0, 1, 2, 700, 999]
    assert [r.rank for r in display_rows(base, 3)] == [0, 1, 2]
    many = dataclasses.replace(base, culprit_ranks=(10, 20, 30, 40))
    assert [r.rank for r in display_rows(many, 2)] == [10, 20]  # culprits first when they alone fill it


def test_input_tally_counts_formats_and_uses_plurals(hung: Summary) -> None:
    assert input_tally(hung) == "inputs: 3 dumps read (3 pickle)"
    one = dataclasses.replace(hung, inputs=hung.inputs[:1] + (dataclasses.replace(hung.inputs[1], fmt="json"),))
    assert input_tally(one) == "inputs: 2 dumps read (1 json, 1 pickle)"
    assert input_tally(dataclasses.replace(hung, inputs=hung.inputs[:1])) == "inputs: 1 dump read (1 pickle)"
    assert input_tally(dataclasses.replace(hung, inputs=())) == "inputs: 0 dumps read"


def test_input_tally_says_why_files_were_skipped_and_what_was_lost(hung: Summary) -> None:
    ignored = (Unreadable("a.pkl", "3.0 GiB, over the 512 MiB cap"), Unreadable("b.pkl", "a symlink out of the folder"),
               Unreadable("c.pkl.zst", "zstd-compressed: not read"), Unreadable("d.pkl", "3.1 GiB, over the 512 MiB cap"),
               Unreadable("notes.txt", "no flight-recorder dump"))
    duplicates = (Duplicate(rank=0, backend="nccl", kept="new", dropped="old"),)
    unreadable = (Unreadable("x", "truncated"), Unreadable("y", "truncated"))
    line = input_tally(dataclasses.replace(hung, ignored=ignored, duplicates=duplicates, unreadable=unreadable))
    assert line == ("inputs: 3 dumps read (3 pickle); 5 files ignored (2 too large, 1 symlinks out of the folder, "
                    "1 compressed, 1 not dumps); 1 duplicate (newest kept); 2 unreadable")
    single = input_tally(dataclasses.replace(hung, ignored=ignored[2:3]))
    assert single == "inputs: 3 dumps read (3 pickle); 1 file ignored (compressed)"


def test_kind_lines_name_the_hosts_to_exclude() -> None:
    c = Classification(HangKind.rank_lost, "rank 2 was gone", ("read its log", "check dmesg"),
                       RestartAction.restart_excluding_hosts, "its host lost a rank twice", ("gpu-17", "gpu-3"))
    base = Summary(source="x", verdict=Verdict.DUMP_MISSING, culprit_ranks=(), process_group=None, collective_seq_id=None, op=None,
                   waiting_ranks=(), findings=(), notes=(), unreadable=(), ranks_seen=(), ranks_missing=(), hosts={},
                   dump_locations={}, stragglers=(), per_rank=(), context={}, classification=c)
    assert kind_lines(base) == ["KIND: rank_lost - rank 2 was gone", "  next: read its log", "  next: check dmesg",
                                "  restart: restart_excluding_hosts (exclude: gpu-17,gpu-3) - its host lost a rank twice"]


def test_a_hang_header_names_culprits_collective_and_waiting_ranks(hung: Summary) -> None:
    lines = render_text(hung).splitlines()
    start = lines.index("HANG: not_entered - culprit rank(s) 1")
    assert lines[start + 1:start + 4] == ["  collective: all_reduce seq 31 in group 0 (default_pg, nccl)",
                                          "  waiting ranks: 0, 2",
                                          "  rank 1: outside any collective (every recorded op finished)"]
    assert "NO HANG FOUND" not in render_text(hung)


def test_no_hang_has_no_culprit_header(healthy: Summary) -> None:
    text = render_text(healthy)
    assert "NO HANG FOUND: no hang: all ranks agree" in text.splitlines()
    assert "HANG:" not in text.replace("NO HANG FOUND:", "") and "culprit" not in text and "findings" not in text


def test_dumps_of_one_host_in_one_folder_need_no_host_section_but_several_hosts_do(hung: Summary) -> None:
    assert "dumps by host:" not in render_text(hung)
    hosts = {r: f"node-{r:02d}" for r in range(12)}
    locations = {f"node-{r:02d}": (f"/local/node-{r:02d}/stall-001",) for r in range(12)}
    text = render_text(dataclasses.replace(hung, hosts=hosts, dump_locations=locations))
    lines = text.splitlines()
    start = lines.index("dumps by host:")
    assert lines[start + 1] == "  node-00 (ranks 0): /local/node-00/stall-001"
    assert lines[start + 8] == "  node-07 (ranks 7): /local/node-07/stall-001"
    assert lines[start + 9] == "  ... 4 more hosts in the JSON report"
    assert "rank 1 on node-01: outside any collective" in text  # the culprit line names its host


def test_long_lists_are_capped_with_a_pointer_to_the_json(hung: Summary) -> None:
    findings = tuple(dataclasses.replace(hung.findings[0], message=f"finding {i}") for i in range(23))
    unreadable = tuple(Unreadable(f"f{i}.pkl", "truncated") for i in range(53))
    text = render_text(dataclasses.replace(hung, findings=findings, unreadable=unreadable))
    assert "[not_entered] finding 19" in text and "finding 20" not in text
    assert "  ... 3 more in the JSON report" in text.splitlines()
    assert "  f49.pkl: truncated" in text and "f50.pkl" not in text
    assert text.splitlines()[-1] == "  ... 3 more in the JSON report"


def test_missing_ranks_notes_and_duplicates_are_listed(hung: Summary) -> None:
    summary = dataclasses.replace(hung, ranks_missing=(3, 4), notes=("group 5 has no members",),
                                  duplicates=(Duplicate(rank=2, backend="nccl", kept="b.pkl", dropped="a.pkl"),))
    lines = render_text(summary).splitlines()
    assert "ranks seen: 3; missing: 3, 4" in lines
    assert "note: group 5 has no members" in lines
    assert lines[lines.index("duplicate dumps of one rank (the newest entries kept):") + 1] == \
        "  rank 2 (nccl): kept b.pkl, dropped a.pkl"


def test_a_low_confidence_finding_says_so(hung: Summary) -> None:
    finding = dataclasses.replace(hung.findings[0], confidence="low")
    text = render_text(dataclasses.replace(hung, findings=(finding,)))
    assert "    group 0 (default_pg, nccl) ranks [0, 1, 2]  seq 31  op all_reduce  confidence low" in text.splitlines()
    assert "confidence" not in render_text(hung)


def test_a_hostile_host_name_is_escaped_in_text_and_markdown(hung: Summary, tmp_path: Path) -> None:
    folder = Path(hung.source)
    evil = "gpu\x1b[2J|<img src=x>"
    for r in range(3):
        (folder / f"rank_{r:05d}.context.json").write_text(json.dumps({"rank": r, "host": evil, "world_size": 3}))
    summary = analyze_folder(folder)
    text = render_text(summary)
    assert "\x1b" not in text and "rank 1 on gpu\\x1b[2J|<img src=x>: outside any collective" in text
    md = render_markdown(summary)
    assert "\x1b" not in md and not re.search(r"(?<!\\)<img", md)  # only ever escaped, as \<img
    assert "| 1 | gpu\\\\x1b\\[2J\\|\\<img src=x\\> | outside\\_collective |" in md


def test_markdown_of_no_hang_has_no_culprit_table(healthy: Summary, hung: Summary) -> None:
    md = render_markdown(healthy)
    assert md.startswith("# Hang summary: `no_hang`\n\n**Hang kind: `no_hang`**")
    assert "| culprit ranks |" not in md and "## Findings" not in md
    assert "| 0 | - | outside\\_collective |" in md
    no_group = render_markdown(dataclasses.replace(hung, process_group=None))
    assert "| process group | - |" in no_group and "| culprit ranks | 1 |" in no_group


def test_a_deadlock_across_groups_is_stated_in_the_header(tmp_path: Path) -> None:
    """Rank 0 waits in group 1 (tp) while rank 1 waits in group 0."""
    lines = render_text(analyze_folder(cross_group_deadlock(tmp_path / "g"))).splitlines()
    hang = next(i for i, line in enumerate(lines) if line.startswith("HANG: "))
    header = lines[hang:lines.index("")]
    assert [line for line in header if "deadlock" in line] == [
        "  deadlock across groups: rank(s) 0 wait in all_reduce of group 1 for rank(s) 1, which wait in all_reduce of "
        "group 0 for them: rank(s) 0 skipped that all_reduce or call the two groups in a different order"]
