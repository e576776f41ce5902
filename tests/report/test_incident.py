"""``report/incident.py``: the ``incident`` block of ``summary.json`` - which event, run and job
it names (and from where when the environment says nothing), its hosts, when the ranks dumped
(the earliest sane ``time_unix``), and which identity is kept when a folder is summarized again.

The round trip through ``write_reports`` and ``history`` is in ``tests/report/test_history.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_ncclx.analysis.model import Summary, Verdict
from lightning_ncclx.report.incident import incident_info, kept_incident

NOW = 1_790_003_600.0
NOW_ISO = "2026-09-21T15:13:20+00:00"


def summary(context: dict | None = None, hosts: dict[int, str] | None = None) -> Summary:
    return Summary(source="x", verdict=Verdict.NO_HANG, culprit_ranks=(), process_group=None, collective_seq_id=None,
                   op=None, waiting_ranks=(), findings=(), notes=(), unreadable=(), ranks_seen=(), ranks_missing=(),
                   hosts=hosts or {}, dump_locations={}, stragglers=(), per_rank=(), context=context or {})


def event_folder(root: Path, *parts: str) -> Path:
    folder = root.joinpath(*parts)
    folder.mkdir(parents=True)
    return folder


def test_identity_from_the_jobs_environment(tmp_path: Path) -> None:
    folder = event_folder(tmp_path, "somewhere", "stall-001")
    info = incident_info(summary({"event": "stall-001"}, {0: "gpu-2", 1: "gpu-1", 2: "gpu-2"}), folder,
                         environ={"LIGHTNING_NCCLX_RUN_ID": "run-7", "SLURM_JOB_ID": "4242"}, now=NOW)
    assert info == {"event": "stall-001", "run_id": "run-7", "job_id": "4242", "hosts": ["gpu-1", "gpu-2"],
                    "dumped_at": None, "summarized_at": NOW_ISO, "folder": str(folder.absolute())}


def test_the_event_name_comes_from_the_context_before_the_folder_name(tmp_path: Path) -> None:
    folder = event_folder(tmp_path, "copied-elsewhere")
    assert incident_info(summary({"event": "ondemand-003"}), folder, environ={}, now=NOW)["event"] == "ondemand-003"
    assert incident_info(summary({}), folder, environ={}, now=NOW)["event"] == "copied-elsewhere"


@pytest.mark.parametrize(("parts", "run_id"), [
    (("outputs", "2026-09-21", "12-00-00", "ncclx_dumps", "stall-001"), "12-00-00"),  # Hydra: <run>/ncclx_dumps/<event>
    (("lightning_logs", "ncclx_dumps", "run-20260921-abc", "stall-001"), "run-20260921-abc"),  # <root>/ncclx_dumps/<run id>/<event>
])
def test_without_a_run_id_in_the_environment_the_run_is_named_by_its_folder(tmp_path: Path, parts, run_id) -> None:
    folder = event_folder(tmp_path, *parts)
    assert incident_info(summary(), folder, environ={}, now=NOW)["run_id"] == run_id


@pytest.mark.parametrize(("environ", "job_id"), [
    ({"PBS_JOBID": "88.pbs", "LSB_JOBID": "9"}, "88.pbs"),
    ({"SLURM_JOB_ID": "", "LSB_JOBID": "9"}, "9"),
    ({"TORCHELASTIC_RUN_ID": "none"}, None),  # torchrun's placeholder is no id
    ({"TORCHELASTIC_RUN_ID": "elastic-1"}, "elastic-1"),
    ({}, None),
])
def test_the_job_id_is_the_first_scheduler_variable_set(tmp_path: Path, environ: dict, job_id: str | None) -> None:
    assert incident_info(summary(), tmp_path, environ=environ, now=NOW)["job_id"] == job_id


def test_dumped_at_is_the_earliest_sane_time_of_the_rank_contexts(tmp_path: Path) -> None:
    contexts = {"rank_00000.context.json": {"time_unix": 1_790_000_120.5},
                "rank_00001.context.json": {"time_unix": 1_790_000_000.9},
                "rank_00002.context.json": {"time_unix": True},  # a bool is no time
                "rank_00003.context.json": {"time_unix": -5},
                "rank_00004.context.json": {"time_unix": "1700000000"},
                "rank_00005.context.json": [1],  # not an object
                "other.context.json": {"time_unix": 1_000_000_000}}  # not a rank's context
    for name, data in contexts.items():
        (tmp_path / name).write_text(json.dumps(data))
    (tmp_path / "rank_00006.context.json").write_text("{truncated")
    assert incident_info(summary(), tmp_path, environ={}, now=NOW)["dumped_at"] == "2026-09-21T14:13:20+00:00"


def test_an_unreadable_folder_has_no_dump_time(tmp_path: Path) -> None:
    assert incident_info(summary(), tmp_path / "gone", environ={}, now=NOW)["dumped_at"] is None


def fresh(event: str = "stall-001") -> dict:
    return {"event": event, "run_id": "later-shell", "job_id": None, "hosts": ["gpu-1"], "dumped_at": None,
            "summarized_at": NOW_ISO, "folder": "/new/place"}


def test_the_first_identity_of_the_same_event_is_kept_and_only_the_summary_time_moves(tmp_path: Path) -> None:
    old = {"event": "stall-001", "run_id": "run-b", "job_id": "102", "hosts": ["gpu-1", "gpu-3"],
           "dumped_at": "2026-09-21T14:13:20+00:00", "summarized_at": "2026-09-21T14:14:00+00:00",
           "folder": None}
    (tmp_path / "summary.json").write_text(json.dumps({"verdict": "not_entered", "incident": old}))
    assert kept_incident(tmp_path, fresh()) == {
        "event": "stall-001", "run_id": "run-b", "job_id": "102", "hosts": ["gpu-1", "gpu-3"],
        "dumped_at": "2026-09-21T14:13:20+00:00", "summarized_at": NOW_ISO,
        "folder": "/new/place"}  # a value the old block lacked (None) is filled in


@pytest.mark.parametrize("content", [
    None,  # no summary.json yet
    json.dumps({"incident": {"event": "stall-002", "run_id": "other"}}),  # another event's summary
    json.dumps({"incident": ["stall-001"]}),
    json.dumps([1, 2]),
    "{not json",
])
def test_anything_but_the_same_events_identity_gives_the_fresh_one(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "summary.json").write_text(content)
    assert kept_incident(tmp_path, fresh()) == fresh()
