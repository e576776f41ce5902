"""Summary -> text / JSON / Markdown / HTML and the files written next to the dumps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lightning_ncclx.analysis import SCHEMA, analyze_folder
from lightning_ncclx.report import render_html, render_json, render_markdown, render_text, write_reports

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, write  # noqa: E402


@pytest.fixture
def hung(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in range(3):
        write(tmp_path / "d", f"rank_{r:05d}.nccl.fr.pkl",
              dump(collectives(30 if r == 1 else 31, last_state="completed" if r == 1 else "started"), groups))
    (tmp_path / "d" / "rank_00001.stacks.txt").write_text(
        "--- thread 'MainThread' (id 1) ---\n"
        '  File "train.py", line 10, in <module>\n    main()\n'
        '  File "train.py", line 7, in load_batch\n    time.sleep(100)\n')
    return analyze_folder(tmp_path / "d")


def test_text_is_plain_and_leads_with_the_culprit(hung):
    text = render_text(hung)
    assert isinstance(text, str) and "[bold" not in text and "\x1b[" not in text
    first = text.splitlines()[:8]
    assert first[0].startswith("KIND: stuck_outside_collective - rank(s) 1 are alive but outside every collective")
    assert first[1].startswith("  next: ") and any(line.startswith("  restart: restart - ") for line in first)
    assert "HANG: not_entered - culprit rank(s) 1" in first
    assert "train.py:7 in load_batch" in first[0]


def test_json_is_the_documented_form(hung):
    d = json.loads(render_json(hung))
    assert d["schema"] == SCHEMA and d["verdict"] == "not_entered" and d["culprit_ranks"] == [1]
    assert d["process_group"] == {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2], "backend": "nccl",
                                  "membership_known": True}
    assert d["collective_seq_id"] == 31 and d["op"] == "all_reduce" and d["waiting_ranks"] == [0, 2]
    for key in ("findings", "unreadable", "ranks_seen", "ranks_missing", "host_ranks", "dump_locations", "stragglers",
                "per_rank", "context", "rank_detail"):
        assert key in d
    f = d["findings"][0]
    assert {"kind", "ranks", "group", "seq", "op", "sizes", "dtypes", "message", "culprit_states"} <= set(f)


def test_markdown_has_the_table(hung):
    md = render_markdown(hung)
    assert md.startswith("# Hang summary: `not_entered`") and "| culprit ranks | 1 |" in md


def test_html_is_self_contained_with_a_timeline(hung):
    page = render_html(hung)
    assert 'id="verdict"' in page and 'id="culprit-stop"' in page and ">rank 1</div>" in page
    assert "outside collectives, in its code" in page and "stuck_outside_collective" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert "<link" not in page and "<script src" not in page


def test_write_reports_writes_four_files_atomically_summary_json_first(hung, tmp_path):
    paths = write_reports(hung, tmp_path / "out")
    assert [p.name for p in paths.values()] == ["summary.json", "summary.txt", "summary.html", "summary-ranks.json"]
    first = json.loads(paths["json"].read_text())
    assert first["verdict"] == "not_entered" and first["rank_detail"] == "summary-ranks.json"
    assert json.loads(paths["ranks"].read_text())["hosts"] == {}
    assert [p.stat().st_mtime_ns for p in paths.values()] == sorted(p.stat().st_mtime_ns for p in paths.values())
    assert not list((tmp_path / "out").glob("*.tmp"))
    # the summaries themselves are never read back as dumps
    assert analyze_folder(tmp_path / "out").ranks_seen == ()


def test_text_names_the_culprits_host_and_where_each_hosts_dumps_were(hung, tmp_path):
    folder = tmp_path / "d"
    for rank, host in ((0, "node-a"), (1, "node-b"), (2, "node-b")):
        (folder / f"rank_{rank:05d}.context.json").write_text(json.dumps({"rank": rank, "host": host, "world_size": 3}))
    text = render_text(analyze_folder(folder))
    assert "rank 1 on node-b: " in text
    assert "dumps by host:" in text and "node-a (ranks 0)" in text and "node-b (ranks 1, 2)" in text


def test_html_embeds_the_json_so_a_path_cannot_close_the_script_tag(tmp_path):
    groups = {"0": ("default_pg", [0, 1])}
    folder = tmp_path / "</script><b>x"
    for r in range(2):
        write(folder, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(5 if r else 6, last_state="started"), groups))
    page = render_html(analyze_folder(folder))
    assert page.count("</script>") == 2  # the embedded JSON's and the click handler's, nothing from the path
    assert "<b>x" not in page
    start = page.index('id="summary">') + len('id="summary">')
    embedded = json.loads(page[start:page.index("</script>", start)])
    assert embedded["verdict"] == "not_entered" and embedded["source"] == str(folder)


def test_a_culprit_beyond_the_first_256_ranks_is_in_the_html_table_and_timeline(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
    from synth import collectives, dump, write

    from lightning_ncclx.analysis import analyze_folder
    from lightning_ncclx.report import render_html, render_markdown

    world = 300
    groups = {"0": ("default_pg", list(range(world)))}
    for r in range(world):
        es = collectives(3) if r == 290 else collectives(4, last_state="started")
        write(tmp_path, f"nccl_trace_rank_{r}", dump(es, groups))
    s = analyze_folder(tmp_path)
    assert s.culprit_ranks == (290,)
    page = render_html(s)
    assert '<tr class="culprit"><td>290</td>' in page
    assert ">rank 290</div>" in page and 'id="culprit-stop"' in page
    assert "| 290 |" in render_markdown(s)
