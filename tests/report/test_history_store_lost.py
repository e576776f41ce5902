"""``lightning-ncclx history`` lists a ``store-lost-NNN`` folder (the job's store died with its
host; the surviving ranks dumped alone, written here by the watchdog's own ``dump_without_store``
in real gloo processes) as an incident: the ranks that wrote, the rank that did not, the time, and
the summary once ``lightning-ncclx summarize`` of it was written there."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ncclx.cli.history import run_history
from lightning_ncclx.cli.summarize import run_summarize
from lightning_ncclx.report.history import find_incidents

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import clean_env  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_history_store_lost")  # its tests share a costly module fixture: one worker

WORKER = Path(__file__).resolve().parent / "store_lost_worker.py"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store_lost(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run")
    dump_dir = root / "ncclx_dumps"
    env = clean_env({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(root / "init"), str(dump_dir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(3)]
    try:
        logs = [p.communicate(timeout=180)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    folder = dump_dir / "store-lost-001"
    assert sorted(p.name for p in folder.glob("rank_*.context.json")) == [
        "rank_00001.context.json", "rank_00002.context.json"], "\n".join(logs)[-4000:]
    return folder


def _history_json(path: Path) -> dict:
    out = io.StringIO()
    assert run_history([path], fmt="json", out=out) == 0
    return json.loads(out.getvalue())


def test_a_store_lost_folder_nobody_summarized_is_an_incident_of_what_it_holds(store_lost: Path) -> None:
    data = _history_json(store_lost.parent)
    assert data["incidents"] == 1 and data["by_kind"] == {"store_lost": 1}, data
    (incident,) = data["list"]
    assert (incident["event"], incident["kind"], incident["store_lost"]) == ("store-lost-001", "store_lost", True)
    assert (incident["dumped_ranks"], incident["missing_ranks"]) == ([1, 2], [0]), incident
    assert incident["culprit_ranks"] == [] and data["exclude"] == []  # no host is known to blame
    contexts = [json.loads(p.read_text()) for p in store_lost.glob("rank_*.context.json")]
    first = min(c["time_unix"] for c in contexts)
    from datetime import UTC, datetime

    assert incident["time"] == datetime.fromtimestamp(first, tz=UTC).isoformat(timespec="seconds")
    assert incident["store_lost_seen"].startswith("RuntimeError: [pair.cc:561] Connection closed by peer")
    text = io.StringIO()
    assert run_history([store_lost.parent], out=text) == 0
    assert "rank(s) 1, 2 wrote their dumps there, rank(s) 0 did not (the store's host among them)" in \
        " ".join(text.getvalue().split()), text.getvalue()
    assert "missing 0" in text.getvalue()


def test_a_store_lost_folder_summarized_later_takes_that_summary(store_lost: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "ncclx_dumps" / store_lost.name
    shutil.copytree(store_lost, folder)
    assert run_summarize(folder, fmt="json", output=folder / "summary.json") == 1  # a finding: rank 0 is missing
    summary = json.loads((folder / "summary.json").read_text())
    incidents, problems = find_incidents([folder.parent])
    assert problems == [] and len(incidents) == 1, problems
    (incident,) = incidents
    assert incident.store_lost and (incident.dumped_ranks, incident.missing_ranks) == ((1, 2), (0,))
    assert (incident.kind, incident.verdict) == (summary["hang_kind"], summary["verdict"])
    assert incident.kind != "store_lost"
