"""``lightning-ncclx history``: incidents of several runs, written by the real analyzer and report
writer, tallied; the host behind repeated incidents is named and listed for --exclude."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.report import write_reports
from lightning_ncclx.report.history import find_incidents, tally

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, write  # noqa: E402

GROUPS = {"0": ("default_pg", [0, 1, 2, 3])}
HOSTS = {0: "gpu-1", 1: "gpu-1", 2: "gpu-17", 3: "gpu-3"}


def _incident(folder: Path, kind: str, time_unix: float, hosts: dict[int, str]) -> None:
    """One event folder of dumps whose analysis gives ``kind``; contexts carry hosts and times."""
    dumped = [0, 1, 2, 3]
    for r in range(4):
        if kind == "rank_lost" and r == 2:
            continue
        n, state = 8, "started"
        if kind == "stuck" and r == 2:
            n, state = 7, "completed"
        es = collectives(n, last_state=state, size=2 if kind == "size" and r == 3 else 4)
        write(folder, f"rank_{r:05d}.nccl.fr.pkl", dump(es, GROUPS))
    for r in dumped:
        (folder / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "host": hosts[r], "world_size": 4, "phase": "train_step", "time_unix": time_unix,
             "event": folder.name}))
    if kind == "rank_lost":
        (folder / "collection.json").write_text(json.dumps({"gone_ranks": [2], "missing_ranks": [2]}))
    if kind == "stuck":
        (folder / "rank_00002.stacks.txt").write_text(
            "--- thread 'MainThread' (id 1) ---\n  File \"train.py\", line 3, in <module>\n"
            '  File "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 9, in __next__\n')


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    plan = [("run-a", "101", "stall-001", "rank_lost", HOSTS),
            ("run-b", "102", "stall-001", "stuck", HOSTS),
            ("run-c", "103", "stall-001", "size", HOSTS),
            ("run-d", "104", "stall-001", "rank_lost", HOSTS),
            ("run-d", "104", "stall-002", "size", {**HOSTS, 3: "gpu-3"})]
    for i, (run, job, event, kind, hosts) in enumerate(plan):
        folder = tmp_path / run / "ncclx_dumps" / event
        folder.mkdir(parents=True)
        _incident(folder, kind, 1_790_000_000 + 3600 * i, hosts)
        monkeypatch.setenv("LIGHTNING_NCCLX_RUN_ID", run)
        monkeypatch.setenv("SLURM_JOB_ID", job)
        write_reports(analyze_folder(folder), folder)
    return tmp_path


def test_incidents_are_self_describing_and_keep_their_identity(runs, monkeypatch):
    folder = runs / "run-b" / "ncclx_dumps" / "stall-001"
    first = json.loads((folder / "summary.json").read_text())["incident"]
    assert (first["run_id"], first["job_id"], first["event"]) == ("run-b", "102", "stall-001")
    assert first["hosts"] == ["gpu-1", "gpu-17", "gpu-3"] and first["dumped_at"].startswith("2026-09-21")
    monkeypatch.setenv("LIGHTNING_NCCLX_RUN_ID", "another-run")  # summarized again later, elsewhere
    monkeypatch.delenv("SLURM_JOB_ID")
    write_reports(analyze_folder(folder), folder)
    again = json.loads((folder / "summary.json").read_text())["incident"]
    assert (again["run_id"], again["job_id"]) == ("run-b", "102")


def test_history_names_the_recurring_host(runs):
    incidents, problems = find_incidents([runs])
    assert problems == [] and [i.kind for i in incidents] == [
        "rank_lost", "stuck_outside_collective", "argument_mismatch", "rank_lost", "argument_mismatch"]
    result = tally(incidents, last=20, min_count=2)
    assert result["runs"] == 4 and result["by_kind"]["rank_lost"] == 2
    flagged = {r["host"]: r for r in result["recurring"]}
    assert flagged["gpu-17"]["message"] == "host gpu-17: 3 of the last 5 incidents, 2 of them rank_lost"
    assert flagged["gpu-3"]["exclude"] is False  # size mismatches are the program's, wherever it ran
    assert result["exclude"] == ["gpu-17"]
    assert tally(incidents, last=2, min_count=2)["exclude"] == []  # only one of the last two


def test_an_event_the_watchdog_did_not_summarize_is_analyzed_now(runs):
    folder = runs / "run-e" / "ncclx_dumps" / "stall-001"
    folder.mkdir(parents=True)
    _incident(folder, "rank_lost", 1_790_100_000, HOSTS)  # killed before it wrote summary.json
    incidents, problems = find_incidents([runs])
    assert problems == [] and len(incidents) == 6
    assert (incidents[-1].kind, incidents[-1].culprit_hosts) == ("rank_lost", ("gpu-17",))
    assert incidents[-1].run_id == "run-e"  # <run>/ncclx_dumps/<event>: the run's folder names it
    assert not (folder / "summary.json").exists()  # history only reads


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "history", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_history_command_prints_a_table_json_and_the_exclude_list(runs, tmp_path):
    text = _cli(str(runs / "run-a"), str(runs / "run-b"), str(runs / "run-c"), str(runs / "run-d"))
    assert text.returncode == 1, text.stderr
    assert "5 incident(s) in 4 run(s)" in text.stdout and "rank_lost" in text.stdout
    assert "RECURRING host gpu-17: 3 of the last 5 incidents, 2 of them rank_lost" in text.stdout
    assert "by culprit host: gpu-17 3, gpu-3 2" in text.stdout and "by culprit rank: 2 3, 3 2" in text.stdout
    assert "exclude: gpu-17" in text.stdout and "--exclude=gpu-17" in text.stdout
    as_json = _cli(str(runs), "--format", "json")
    data = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and data["exclude"] == ["gpu-17"] and len(data["list"]) == 5
    assert data["list"][0]["run_id"] == "run-a" and data["list"][0]["job_id"] == "101"
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = _cli(str(empty))
    assert nothing.returncode == 2 and "no incident" in nothing.stderr
