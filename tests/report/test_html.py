"""``report/html.py``: the generated markup, not its look in a browser (that is
``tests/report/test_browser.py``). Hostile host, group and frame names from the dumps reach the
page only as text (no element or attribute of theirs survives, and each reads back as it was);
which sections a hang and a healthy job get; the restart line with hosts to exclude; the
timeline's op abbreviations, group legend and empty case; the JSON embedded in ``<script>``."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.kind import Classification, HangKind, RestartAction
from lightning_ncclx.analysis.model import Summary, Verdict
from lightning_ncclx.report.html import _abbreviation, embed_json, render_html

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, cross_group_deadlock, dump, write  # noqa: E402

EVIL_HOST = '<img src=x onerror="alert(1)">'
EVIL_DESC = "<script>alert('pg')</script>"
EVIL_FILE = "<svg onload=alert(2)>.py"

ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "main", "div", "h1", "h2", "span", "p", "section",
                "ol", "li", "b", "br", "code", "pre", "table", "tr", "th", "td", "script"}
ALLOWED_ATTRIBUTES = {"charset", "id", "class", "title", "style", "data-d", "type"}


class Markup(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parse(page: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Markup()
    parser.feed(page)
    return parser.tags


def _section(page: str, heading: str) -> str | None:
    found = re.search(rf"<section><h2>{heading}</h2>.*?</section>", page)
    return found[0] if found else None


@pytest.fixture
def hostile(tmp_path: Path) -> Summary:
    """Rank 1 of 3 never entered all_reduce seq 31; every name it can carry is markup."""
    folder = tmp_path / "d"
    groups = {"0": (EVIL_DESC, [0, 1, 2])}
    for r in range(3):
        write(folder, f"rank_{r:05d}.nccl.fr.pkl",
              dump(collectives(30 if r == 1 else 31, last_state="completed" if r == 1 else "started",
                               pg=("0", EVIL_DESC)), groups))
        (folder / f"rank_{r:05d}.context.json").write_text(json.dumps({"rank": r, "host": EVIL_HOST, "world_size": 3}))
    (folder / "rank_00001.stacks.txt").write_text(
        "--- thread 'MainThread' (id 1) ---\n"
        '  File "train.py", line 10, in <module>\n    main()\n'
        f'  File "{EVIL_FILE}", line 7, in load_&batch\n    time.sleep(100)\n')
    return analyze_folder(folder)


@pytest.fixture
def healthy(tmp_path: Path) -> Summary:
    for r in range(2):
        write(tmp_path / "h", f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(5), {"0": ("default_pg", [0, 1])}))
    return analyze_folder(tmp_path / "h")


def test_hostile_names_add_no_element_or_attribute(hostile: Summary) -> None:
    page = render_html(hostile)
    tags = parse(page)
    assert {tag for tag, _ in tags} <= ALLOWED_TAGS
    assert {name for _, attrs in tags for name in attrs} <= ALLOWED_ATTRIBUTES
    assert [tag for tag, _ in tags].count("script") == 2 and [tag for tag, _ in tags].count("img") == 0
    assert EVIL_HOST not in page and EVIL_DESC not in page and EVIL_FILE not in page


def test_hostile_names_read_back_as_the_text_they_were(hostile: Summary) -> None:
    page = render_html(hostile)
    assert f"<b>rank 1 on {html.escape(EVIL_HOST)}</b>" in page  # the culprit panel
    assert f"<code>{html.escape(EVIL_FILE)}:7 in load_&amp;batch</code>" in page
    culprit_row = re.search(r'<tr class="culprit">(.*?)</tr>', page)[1]
    assert re.findall(r"<td>(.*?)</td>", culprit_row)[:2] == ["1", html.escape(EVIL_HOST)]
    details = [attrs["data-d"] for tag, attrs in parse(page) if "data-d" in attrs]
    assert f"rank 1 {EVIL_HOST}: no entry for seq 31 in {EVIL_DESC}" in details  # unescaped by the parser: as it was


def test_a_hang_gets_the_red_verdict_the_culprit_panel_and_the_culprit_marks(hostile: Summary) -> None:
    page = render_html(hostile)
    verdict = next(attrs for tag, attrs in parse(page) if attrs.get("id") == "verdict")
    assert verdict["class"] == "bad"
    assert '<h1><span class="kind">stuck_outside_collective</span>HANG: not_entered, culprit rank(s) 1</h1>' in page
    assert _section(page, "Culprit") is not None
    assert page.count('id="culprit-stop"') == 1 and page.count('<tr class="culprit">') == 1
    assert "<title>lightning-ncclx: stuck_outside_collective</title>" in page


def test_a_healthy_job_gets_the_green_verdict_and_no_culprit(healthy: Summary) -> None:
    page = render_html(healthy)
    verdict = next(attrs for tag, attrs in parse(page) if attrs.get("id") == "verdict")
    assert verdict["class"] == "ok"
    assert '<h1><span class="kind">no_hang</span>NO HANG: no_hang</h1>' in page
    assert _section(page, "Culprit") is None and 'id="culprit-stop"' not in page and 'class="culprit"' not in page
    assert "<section><h2>What to do next</h2><ol><li>nothing to do</li></ol>" in page


def test_a_no_hang_verdict_with_a_warning_kind_is_not_shown_green(healthy: Summary) -> None:
    odd = Classification(HangKind.unknown, "the dumps disagree", ("read the findings below",), RestartAction.restart, "cheap test")
    page = render_html(dataclasses.replace(healthy, classification=odd))
    assert '<div id="verdict" class="bad"><h1><span class="kind">unknown</span>HANG: unknown</h1>' in page


def test_a_program_stall_is_a_hang_not_a_green_no_hang(healthy: Summary) -> None:
    stalled = Classification(HangKind.program_stalled, "every rank stopped in the program", ("look at it",),
                             RestartAction.do_not_restart, "fix it first")
    page = render_html(dataclasses.replace(healthy, classification=stalled, verdict=Verdict.STALLED))
    assert '<div id="verdict" class="bad"><h1><span class="kind">program_stalled</span>HANG: stalled</h1>' in page
    assert "NO HANG" not in page


def test_the_restart_line_names_the_hosts_to_exclude(hostile: Summary) -> None:
    c = Classification(HangKind.rank_lost, "rank 2 was gone", ("read <its> log",), RestartAction.restart_excluding_hosts,
                       "its host lost a rank twice", ("gpu-17", "gpu-3"))
    page = render_html(dataclasses.replace(hostile, classification=c))
    assert ('<p class="restart restart_excluding_hosts">restart: restart_excluding_hosts (exclude gpu-17,gpu-3)</p>'
            "<p>its host lost a rank twice</p>") in page
    assert "<li>read &lt;its&gt; log</li>" in page


def test_the_title_lists_at_most_eight_culprits(hostile: Summary) -> None:
    page = render_html(dataclasses.replace(hostile, culprit_ranks=tuple(range(10, 22))))
    assert "HANG: not_entered, culprit rank(s) 10, 11, 12, 13, 14, 15, 16, 17</h1>" in page


def test_the_culprit_panel_shows_four_culprits_a_waiting_ranks_line_and_two_pieces_of_evidence(hostile: Summary) -> None:
    head = hostile.findings[0]
    states = tuple(dataclasses.replace(head.culprit_states[0], rank=r) for r in (1, 3, 4, 5, 6))
    finding = dataclasses.replace(head, culprit_states=states, evidence=("first", "second", "third"))
    rows = tuple(dataclasses.replace(r, location="train.py:99 in step") if r.rank == 0 else r for r in hostile.per_rank)
    panel = _section(render_html(dataclasses.replace(hostile, findings=(finding,), per_rank=rows)), "Culprit")
    assert re.findall(r"<b>rank (\d+)", panel) == ["1", "3", "4", "5"]
    assert "<li>waiting rank 0: in all_reduce (seq 31) in group 0" in panel and "<code>train.py:99 in step</code>" in panel
    assert "<li><code>first</code></li><li><code>second</code></li></ol>" in panel and "third" not in panel


@pytest.mark.parametrize(("op", "short"), [("all_reduce", "AR"), ("_allgather_base", "AG"), ("reduce_scatter_tensor", "RS"),
                                           ("barrier", "BAR"), ("alltoall_base", "A2A"), ("send", "SEND"),
                                           ("broadcast (coalesced)", "BC"), ("custom_op", "CUST")])
def test_op_abbreviations(op: str, short: str) -> None:
    assert _abbreviation(op) == short


def test_a_job_without_recorded_collectives_says_so_instead_of_a_grid(tmp_path: Path) -> None:
    for r in range(2):
        write(tmp_path / "e", f"rank_{r:05d}.nccl.fr.pkl", dump([], {"0": ("default_pg", [0, 1])}))
    page = render_html(analyze_folder(tmp_path / "e"))
    assert "<p>No collective was recorded by any dumped rank.</p>" in page and 'class="grid"' not in page


def test_a_timeline_over_several_groups_has_a_legend_naming_them(tmp_path: Path) -> None:
    """Rank 0 waits in group 1 (tp) while rank 1 waits in group 0: a cross-group deadlock."""
    page = render_html(analyze_folder(cross_group_deadlock(tmp_path / "g")))
    assert '<p class="legend">groups: 0: default_pg; 1: tp</p>' in page
    headers = re.findall(r'<div class="hd( div)?" title="[^"]*">([^<]*)</div>', page)
    assert [h for _, h in headers] == ["0:1", "1:1", "0:2", "0:3", "1:2"]
    assert [h for div, h in headers if div] == ["0:3"]
    assert "<li><code>deadlock across groups: rank(s) 0 wait in all_reduce of group 1" in page


def test_embedded_json_has_no_markup_characters_and_reads_back_unchanged() -> None:
    data = {"path": "</script><!-- & -->", "sep": "a\u2028b\u2029c", "n": [1, 2.5, None]}
    text = embed_json(data)
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert "\\u003c/script\\u003e\\u003c!-- \\u0026 --\\u003e" in text and "a\\u2028b\\u2029c" in text
    assert json.loads(text) == data


def test_the_page_embeds_the_summary_json_and_the_full_text_report(hostile: Summary) -> None:
    page = render_html(hostile)
    start = page.index('<script type="application/json" id="summary">') + len('<script type="application/json" id="summary">')
    embedded = json.loads(page[start:page.index("</script>", start)])
    assert embedded == json.loads(json.dumps(hostile.to_dict()))
    report = re.search(r"<section><h2>Full report</h2><pre>(.*?)</pre></section>", page, re.S)[1]
    assert html.unescape(report).startswith("KIND: stuck_outside_collective - ")
    assert f"rank 1 on {EVIL_HOST}: outside any collective" in html.unescape(report)
