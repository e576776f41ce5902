"""The reports of a 16,384-rank hang: summary.json and summary.html each under 512 KiB, with the
first answer and every rank still named; every rank's own row, host, phase and step in the
per-rank detail file; summary.json written before the other files.

The summary is built as the analyzer builds it for a job of 8 ranks per host, a default group
and a tensor-parallel group per host, rank 5,466 stuck in its data loader: its host's 7 other
ranks wait in their ``tp`` all_reduce, every other rank in the default group's (building 16,384
dumps and analyzing them would take minutes; ``bench/bench_summary_size.py`` does that)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_ncclx.alerts.message import trigger_document
from lightning_ncclx.analysis.kind import Classification, HangKind, RestartAction
from lightning_ncclx.analysis.model import (CulpritState, Finding, GroupRef, InputFile, RankRow, Summary, TimelineOp,
                                            Verdict)
from lightning_ncclx.analysis.rank_sets import decode, rank_map, ungroup
from lightning_ncclx.report import render_html, render_json, write_reports
from lightning_ncclx.report.incident_file import read_incident

pytestmark = pytest.mark.xdist_group("test_scale_reports")  # its tests share a costly module fixture: one worker

WORLD = 16_384
PER_HOST = 8
CULPRIT = WORLD // 3 + 5
LIMIT = 512 * 1024
ROOT = "/shared/runs/llm-70b/ncclx_dumps/stall-001"
LOADER = "train.py:88 in training_step"
T0 = 1_796_000_000_000_000_000


def _host(rank: int) -> str:
    return f"node-{rank // PER_HOST:05d}"


def _timeline(rank: int, open_group: str | None) -> tuple[TimelineOp, ...]:
    ops = []
    for step in range(15, 25):
        t = T0 + step * 120_000_000 + rank * 7
        tp_done = step < 24 or open_group != "tp"
        ops.append(TimelineOp(str(1 + rank // PER_HOST), step, "all_reduce", tp_done, t))
        if step < 24 or open_group == "0":
            ops.append(TimelineOp("0", step, "all_reduce", step < 24, t + 9_000_000))
    return tuple(ops[-20:])


def _row(rank: int, tp_per_host_class: bool) -> RankRow:
    tp = str(1 + rank // PER_HOST)
    if rank == CULPRIT:
        return RankRow(rank, _host(rank), "outside_collective", "outside any collective, waiting for the data loader",
                       LOADER, _timeline(rank, None)[:-1])
    if rank // PER_HOST == CULPRIT // PER_HOST or tp_per_host_class:
        return RankRow(rank, _host(rank), "in_collective", f"in all_reduce (seq 24) in group {tp} (tp) [started]",
                       "train.py:120 in training_step", _timeline(rank, "tp"))
    return RankRow(rank, _host(rank), "in_collective", "in all_reduce (seq 24) in group 0 (default_pg) [started]",
                   "train.py:131 in training_step", _timeline(rank, "0"))


def big_summary(tp_per_host_class: bool = False) -> Summary:
    """A 16,384-rank summary; ``tp_per_host_class``: every host's ranks wait in their own group
    (2,048 classes of alike rows instead of 3)."""
    ranks = tuple(range(WORLD))
    group = GroupRef("0", "default_pg", ranks, "nccl")
    waiting = tuple(r for r in ranks if r != CULPRIT)
    state = CulpritState(CULPRIT, "outside_collective", "outside any collective, waiting for the data loader", LOADER)
    message = (f"not_entered: rank(s) {CULPRIT} never entered all_reduce (seq 24) of group 0 (default_pg, nccl); "
               f"{WORLD - 1} ranks wait in it")
    finding = Finding(Verdict.NOT_ENTERED, (CULPRIT,), group, 24, "all_reduce", ("all_reduce", ((1 << 20,),),
                      ("BFloat16",), ((1 << 20,),), ("BFloat16",)), {CULPRIT: None}, waiting, (state,), message,
                      evidence=("call sites first differ at seq 24: rank 0: train.py:131 in training_step",))
    folder = {r: ROOT if r < PER_HOST else f"{ROOT}/ranks/{_host(r)}" for r in ranks}
    inputs = tuple(InputFile(f"{folder[r]}/rank_{r:05d}.nccl.fr.pkl", r, "file name", "nccl", "pickle", "2.10",
                             "2.28.9", 47 if r != CULPRIT else 46) for r in ranks)
    classification = Classification(
        HangKind.stuck_outside_collective,
        f"rank(s) {CULPRIT} are alive but outside every collective, waiting for the data loader",
        (f"rank {CULPRIT} on {_host(CULPRIT)} is in its own code at {LOADER}", "look at the data loader's workers"),
        RestartAction.restart, "a stuck loader, IO or lock is often transient")
    return Summary(
        source=ROOT, verdict=Verdict.NOT_ENTERED, culprit_ranks=(CULPRIT,), process_group=group,
        collective_seq_id=24, op="all_reduce", waiting_ranks=waiting, findings=(finding,), notes=(),
        unreadable=(), ranks_seen=ranks, ranks_missing=(), hosts={r: _host(r) for r in ranks},
        dump_locations={_host(r): (folder[r],) for r in ranks}, stragglers=(),
        per_rank=tuple(_row(r, tp_per_host_class) for r in ranks),
        context={"world_size": WORLD, "event": "stall-001", "reason": "stall", "initiator_rank": 0,
                 "phase_by_rank": {str(r): "train_step" for r in ranks},
                 "step_by_rank": {str(r): 41 if r != CULPRIT else 40 for r in ranks},
                 "backends": ["nccl"], "versions": ["2.10"]},
        inputs=inputs, classification=classification)


@pytest.fixture(scope="module")
def summary() -> Summary:
    return big_summary()


@pytest.fixture(scope="module")
def written(summary: Summary, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_reports(summary, tmp_path_factory.mktemp("stall-001"))


def test_summary_json_at_16384_ranks_is_under_512_kib_with_the_first_answer(written: dict[str, Path]) -> None:
    assert written["json"].stat().st_size < LIMIT
    d = json.loads(written["json"].read_text())
    assert d["schema"] == "lightning-ncclx/summary/2" and d["hang_kind"] == "stuck_outside_collective"
    assert d["culprit_ranks"] == str(CULPRIT) and decode(d["culprit_ranks"]) == (CULPRIT,)
    assert d["headline"].startswith(f"not_entered: rank(s) {CULPRIT} never entered") and d["advice"]
    assert d["ranks_seen"] == f"0-{WORLD - 1}" and d["ranks_missing"] == ""
    assert d["waiting_ranks"] == f"0-{CULPRIT - 1},{CULPRIT + 1}-{WORLD - 1}"
    assert d["findings"][0]["group"]["ranks"] == f"0-{WORLD - 1}"
    assert d["rank_detail"] == "summary-ranks.json"


def test_every_rank_is_still_named_in_summary_json(written: dict[str, Path]) -> None:
    d = json.loads(written["json"].read_text())
    hosts = rank_map(d, "host_ranks", "hosts")
    assert len(hosts) == WORLD and hosts[CULPRIT] == _host(CULPRIT) and len(d["host_ranks"]) == WORLD // PER_HOST
    assert d["host_ranks"][_host(CULPRIT)] == f"{CULPRIT - CULPRIT % PER_HOST}-{CULPRIT - CULPRIT % PER_HOST + 7}"
    classed = sorted(r for c in d["rank_classes"] for r in decode(c["ranks"]))
    assert classed == list(range(WORLD))
    assert [c["count"] for c in d["rank_classes"]] == [1, 7, WORLD - 8]
    assert ungroup(d["context"]["phase_ranks"]) == dict.fromkeys(range(WORLD), "train_step")
    assert d["context"]["step_ranks"] == {"41": f"0-{CULPRIT - 1},{CULPRIT + 1}-{WORLD - 1}", "40": str(CULPRIT)}
    assert "phase_by_rank" not in d["context"] and "hosts" not in d
    # the culprit's host's dump folder is among the 64 listed; the others' are in the detail file
    assert _host(CULPRIT) in d["dump_locations"] and len(d["dump_locations"]) == 64
    assert d["dump_locations_left_out"] == WORLD // PER_HOST - 64


def test_the_per_rank_detail_file_holds_every_rank(written: dict[str, Path]) -> None:
    detail = json.loads(written["ranks"].read_text())
    assert detail["schema"] == "lightning-ncclx/summary-ranks/1"
    assert len(detail["hosts"]) == len(detail["per_rank"]) == len(detail["inputs"]) == WORLD
    assert detail["per_rank"][CULPRIT]["location"] == LOADER and detail["hosts"][str(WORLD - 1)] == _host(WORLD - 1)
    assert detail["step_by_rank"][str(CULPRIT)] == 40 and len(detail["dump_locations"]) == WORLD // PER_HOST


def test_summary_html_at_16384_ranks_is_under_512_kib_with_ranks_grouped(written: dict[str, Path]) -> None:
    page = written["html"].read_text()
    assert len(page.encode()) < LIMIT
    assert f"Ranks, grouped ({WORLD} ranks)" in page and f"<td>0-{WORLD - 1}</td>" not in page
    assert f'<tr class="culprit"><td>{CULPRIT}</td><td>1</td><td>{_host(CULPRIT)}</td>' in page
    assert "summary-ranks.json" in page


def test_summary_json_is_written_before_the_other_files(written: dict[str, Path]) -> None:
    order = sorted(written, key=lambda kind: written[kind].stat().st_mtime_ns)
    assert order == ["json", "text", "html", "ranks"]


def test_many_classes_of_alike_ranks_stay_under_512_kib() -> None:
    """Every host's ranks wait in their own group: 2,048 classes of rows, each with its own
    example row."""
    many = big_summary(tp_per_host_class=True)
    text = render_json(many)
    d = json.loads(text)
    assert len(text.encode()) < LIMIT and len(render_html(many).encode()) < LIMIT
    assert sorted(r for c in d["rank_classes"] for r in decode(c["ranks"])) == list(range(WORLD))
    assert CULPRIT in [row["rank"] for row in d["per_rank"]]


def test_history_and_the_alert_read_the_ranges_and_schema_1_alike(written: dict[str, Path], tmp_path: Path) -> None:
    new = read_incident(written["json"])
    assert (new.kind, new.culprit_ranks, new.culprit_hosts) == ("stuck_outside_collective", (CULPRIT,),
                                                                (_host(CULPRIT),))
    alert = trigger_document(written["json"].parent, json.loads(written["json"].read_text()), event="stall-001",
                             reason="stall", exit_code=78, dedup_key="k", environ={})
    assert alert["culprit_ranks"] == [CULPRIT] and alert["culprit_hosts"] == [_host(CULPRIT)]
    old = tmp_path / "old" / "summary.json"  # as an older version wrote it, still on disk in older run folders
    old.parent.mkdir()
    old.write_text(json.dumps({"schema": "lightning-ncclx/summary/1", "hang_kind": "rank_lost", "verdict": "dump_missing",
                               "culprit_ranks": [3], "hosts": {"0": "gpu-0", "3": "gpu-3"},
                               "context": {"phase_by_rank": {"0": "train_step"}}}))
    assert read_incident(old).culprit_hosts == ("gpu-3",)
    alert = trigger_document(old.parent, json.loads(old.read_text()), event="e", reason="stall", exit_code=75,
                             dedup_key="k", environ={})
    assert alert["culprit_ranks"] == [3] and alert["culprit_hosts"] == ["gpu-3"]
