"""The summarizing rank's first answer: ``summary.json`` is on disk when the gather returns; the
other reports follow on a thread of their own (:class:`~lightning_ncclx.events.gather.ReportsWriter`),
joined by :func:`finish_reports` or, before the process ends, :func:`wait_for_reports`."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.load import walk_order
from lightning_ncclx.events import gather
from lightning_ncclx.events.collection import CollectionResult, document_text
from lightning_ncclx.events.gather import ReportsWriter, finish_reports, wait_for_reports
from lightning_ncclx.events.wire import EventMeta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, write  # noqa: E402

WORLD, STUCK = 4, 2


def _stall(folder: Path) -> CollectionResult:
    groups = {"0": ("default_pg", list(range(WORLD)))}
    for r in range(WORLD):
        es = collectives(9 if r == STUCK else 10, lib="gloo", last_state="completed" if r == STUCK else "started")
        write(folder, f"rank_{r:05d}.gloo.fr.pkl", dump(es, groups))
    summary = analyze_folder(folder)
    event = EventMeta(number=1, name="stall-001", reason="stall", initiator=0)
    return CollectionResult(event=event, folder=folder, world_size=WORLD, dumped_ranks=list(range(WORLD)),
                            missing_ranks=[], summary=summary)


def test_the_other_reports_wait_for_their_thread_and_finish_reports_names_them(tmp_path: Path, monkeypatch) -> None:
    result = _stall(tmp_path)
    gate = threading.Event()
    real = gather.write_other_reports

    def held(*args):  # the thread writes only once the test lets it
        gate.wait(30)
        return real(*args)

    monkeypatch.setattr(gather, "write_other_reports", held)
    result.reports = gather.write_first_answer(result.summary, tmp_path, 0)
    result.reports_writer = ReportsWriter(result, result.summary)
    assert (tmp_path / "summary.json").is_file() and not (tmp_path / "summary.html").exists()
    assert result.text is None
    gate.set()
    finish_reports(result)
    assert result.reports_writer is None
    assert set(result.reports) >= {"json", "text", "html"}
    assert (tmp_path / "summary.html").is_file() and (tmp_path / "summary.txt").read_text() == result.text
    assert json.loads((tmp_path / "summary.json").read_text())["culprit_ranks"] == [STUCK]


def test_wait_for_reports_joins_every_writer_still_running(tmp_path: Path, monkeypatch) -> None:
    result = _stall(tmp_path)
    gate = threading.Event()
    real = gather.write_other_reports
    monkeypatch.setattr(gather, "write_other_reports", lambda *args: (gate.wait(30), real(*args))[1])
    writer = ReportsWriter(result, result.summary)
    threading.Timer(0.2, gate.set).start()
    wait_for_reports(60)
    assert writer.join(0) and (tmp_path / "summary-ranks.json").is_file()


def test_collection_text_reads_back_as_the_document() -> None:
    document = {"schema": "x", "ranks": list(range(5)), "gathered": {"3": "/a/b"}, "none": None}
    text = document_text(document)
    assert json.loads(text) == document and text.count("\n") == len(document) + 1
    assert json.loads(document_text({})) == {}


def test_walk_order_splits_plain_paths_as_path_does() -> None:
    for path in ("/a", "/a/b/c.pkl", "//a/b", "/a//b", "/a/./b", "/a/.", "/a/b/", "/", "/a/../b", "rel/x", "/a/.b/c"):
        where = Path(path)
        assert walk_order(path) == (where.parent.parts, where.name), path
