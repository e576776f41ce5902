"""An event the watchdog saw recover (``collection.json``'s ``recovery``): every report form says
so at the top, ``summary.json`` carries it, ``history`` counts it apart and never excludes a host
for it, and the watchdog writes the reports again without a second analysis. A recovery that
does not check is read as none."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.collection_file import MAX_REFUSED_LINES, read_collection, recovery_from
from lightning_ncclx.events.collection import CollectionResult
from lightning_ncclx.events.gather import record_recovery, write_summary_reports
from lightning_ncclx.events.wire import EventMeta
from lightning_ncclx.report import render_json, render_markdown, render_text
from lightning_ncclx.report.history import find_incidents, tally

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, write  # noqa: E402

WORLD = 4
STUCK = 2


def _stall(folder: Path, host_of_culprit: str = "node-b") -> Path:
    """4 ranks; rank 2 never entered the newest all_reduce."""
    folder.mkdir(parents=True, exist_ok=True)
    groups = {"0": ("default_pg", list(range(WORLD)))}
    for r in range(WORLD):
        es = collectives(9 if r == STUCK else 10, lib="gloo", last_state="completed" if r == STUCK else "started")
        write(folder, f"rank_{r:05d}.gloo.fr.pkl", dump(es, groups))
        host = host_of_culprit if r == STUCK else "node-a"
        (folder / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "host": host, "world_size": WORLD, "phase": "train_step"}))
    return folder


def _with_collection(folder: Path, **fields: Any) -> Path:
    (folder / "collection.json").write_text(json.dumps({"schema": "lightning-ncclx/collection/1", **fields}))
    return folder


RECOVERED = {"recovered": True, "lasted_seconds": 11.8, "ranks_moved_on": WORLD}


def test_every_report_form_says_the_event_recovered_first(tmp_path: Path) -> None:
    summary = analyze_folder(_with_collection(_stall(tmp_path / "stall-001"), recovery=RECOVERED))
    assert summary.culprit_ranks == (STUCK,)  # the evidence is kept as it was taken
    assert summary.recovery is not None and summary.recovery.lasted_seconds == 11.8
    data = json.loads(render_json(summary))
    assert data["recovery"] == {"recovered": True, "lasted_seconds": 11.8, "ranks_moved_on": WORLD,
                                "message": summary.recovery.message}
    assert render_text(summary).splitlines()[0] == "RECOVERED: " + summary.recovery.message
    assert summary.recovery.message.startswith("recovered after 11.8 s: not a hang")
    assert "**Recovered**: recovered after 11.8 s" in render_markdown(summary).split("**Hang kind")[0]


def test_without_a_recovery_nothing_says_recovered(tmp_path: Path) -> None:
    summary = analyze_folder(_stall(tmp_path / "stall-001"))
    assert summary.recovery is None
    assert json.loads(render_json(summary))["recovery"] is None
    assert "RECOVERED" not in render_text(summary) and "Recovered" not in render_markdown(summary)


@pytest.mark.parametrize("raw", [
    {"recovered": "true", "lasted_seconds": 3}, {"recovered": 1, "lasted_seconds": 3},
    {"recovered": True}, {"recovered": True, "lasted_seconds": "3"}, {"recovered": True, "lasted_seconds": True},
    {"recovered": True, "lasted_seconds": -1}, {"recovered": True, "lasted_seconds": math.inf},
    {"recovered": True, "lasted_seconds": math.nan}, {"recovered": True, "lasted_seconds": 1e300},
    [True, 3], "recovered", None, 7,
])
def test_a_recovery_that_does_not_check_is_none(raw: Any) -> None:
    assert recovery_from(raw) is None


def test_a_recovery_with_an_odd_count_keeps_the_time_only() -> None:
    got = recovery_from({"recovered": True, "lasted_seconds": 2, "ranks_moved_on": -3})
    assert got is not None and got.lasted_seconds == 2.0 and got.ranks_moved_on is None


def test_hostile_collection_values_are_read_as_absent(tmp_path: Path) -> None:
    folder = _stall(tmp_path / "stall-001")
    (folder / "collection.json").write_text('{"recovery": {"recovered": true, "lasted_seconds": NaN}, '
                                            '"refused": [1, {"a": 2}, "x", "' + "y" * 5000 + '"]}')
    facts = read_collection(folder)
    assert facts.recovery is None
    assert facts.refused == ("x", "y" * 300)
    (folder / "collection.json").write_text("[]")
    assert read_collection(folder).recovery is None and read_collection(folder).refused == ()


def test_refused_store_values_are_in_the_summary_notes_capped(tmp_path: Path) -> None:
    lines = [f"rank {i}'s announcement: not JSON" for i in range(MAX_REFUSED_LINES + 7)]
    summary = analyze_folder(_with_collection(_stall(tmp_path / "stall-001"), refused=lines))
    noted = [n for n in summary.notes if n.startswith("left out by the watchdog: ")]
    assert len(noted) == MAX_REFUSED_LINES + 1
    assert noted[0] == "left out by the watchdog: rank 0's announcement: not JSON"
    assert noted[-1].endswith("and 7 more (collection.json)")
    assert summary.culprit_ranks == (STUCK,)


def test_history_counts_recovered_events_apart_and_excludes_no_host_for_them(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for i in range(3):  # three waits on node-b that ended: a host behind them is no reason to exclude it
        folder = _with_collection(_stall(runs / f"run-{i}" / "stall-001"), recovery=RECOVERED)
        write_summary_reports(analyze_folder(folder), folder, 0)
    incidents, problems = find_incidents([runs])
    assert not problems and len(incidents) == 3
    assert all(i.recovered_after_seconds == 11.8 for i in incidents)
    result = tally(incidents, last=20, min_count=2)
    assert result["recovered"] == 3 and result["incidents"] == 0 and result["by_kind"] == {}
    assert result["exclude"] == [] and result["by_host"] == {}

    for i in range(2):  # two that did not recover: node-b now recurs
        folder = _stall(runs / f"run-hang-{i}" / "stall-001")
        write_summary_reports(analyze_folder(folder), folder, 0)
    incidents, _ = find_incidents([runs])
    result = tally(incidents, last=20, min_count=2)
    assert result["recovered"] == 3 and result["incidents"] == 2
    assert result["by_host"] == {"node-b": 2}


def test_the_history_table_marks_recovered_events(tmp_path: Path) -> None:
    from io import StringIO

    from lightning_ncclx.cli.history import run_history

    folder = _with_collection(_stall(tmp_path / "run" / "stall-001"), recovery=RECOVERED)
    write_summary_reports(analyze_folder(folder), folder, 0)
    out = StringIO()
    assert run_history([tmp_path], out=out) == 0
    text = out.getvalue()
    assert "1 of them recovered" in text and "recovered" in text.split("┃")[-1]  # the kind column of its row
    assert "recovered (waits that ended, not hangs; counted apart): 1" in text
    out = StringIO()
    assert run_history([tmp_path], fmt="json", out=out) == 0
    data = json.loads(out.getvalue())
    assert data["recovered"] == 1 and data["list"][0]["recovered_after_seconds"] == 11.8


def test_record_recovery_rewrites_the_reports_from_the_summary_in_memory(tmp_path: Path) -> None:
    folder = _stall(tmp_path / "stall-001")
    summary = analyze_folder(folder)
    event = EventMeta(number=1, name="stall-001", reason="stall", initiator=0)
    result = CollectionResult(event=event, folder=folder, world_size=WORLD, dumped_ranks=list(range(WORLD)),
                              missing_ranks=[], summary=summary)
    result.reports, result.text = write_summary_reports(summary, folder, 0)
    for dumped in folder.glob("rank_*.gloo.fr.pkl"):  # a second analysis would now find nothing
        dumped.unlink()
    record_recovery(result, dict(RECOVERED))
    data = json.loads((folder / "summary.json").read_text())
    assert data["recovery"]["lasted_seconds"] == 11.8 and data["culprit_ranks"] == [STUCK]
    assert (folder / "summary.txt").read_text().startswith("RECOVERED: recovered after 11.8 s")
    assert 'id="recovered"' in (folder / "summary.html").read_text()
    assert json.loads((folder / "collection.json").read_text())["recovery"]["recovered"] is True
    assert result.text is not None and result.text.startswith("RECOVERED")
    shutil.rmtree(folder)
