"""A real 3-rank Lightning job (gloo on CPU) serves each rank's ``/metrics`` (port + local rank)
and merges them into one node_exporter textfile; both are read with prometheus_client's own
parser during the fit and after a stall."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import watchdog.harness as harness
from support import free_port
from watchdog.harness import start_job, wait_for

pytestmark = pytest.mark.timeout(300)
METRICS_JOB = Path(__file__).parent / "jobs" / "metrics_job.py"


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, name: str, **labels: str) -> float | None:
    for (sample, sample_labels), value in samples.items():
        if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items()):
            return value
    return None


def _scrape(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return _samples(answer.read().decode())
    except OSError:
        return None


def test_metrics_are_served_and_merged_during_a_fit_and_after_a_stall(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_port(3)  # rank r serves on base + r
    textfile = tmp_path / "textfile" / "ncclx.prom"
    monkeypatch.setenv("NCCLX_TEST_METRICS", json.dumps({"port": base, "address": "127.0.0.1",
                                                         "textfile": str(textfile), "interval_seconds": 0.5}))
    monkeypatch.setattr(harness, "JOB", METRICS_JOB)
    job = start_job(tmp_path, "--fault", "stuck_train", "--fault-rank", "1", "--at-batch", "12",
                    "--batches", "40", "--step-sleep", "0.3", "--on-stall", "dump")
    try:
        during: dict[int, dict] = {}

        def every_rank_stepping() -> bool:
            for rank in range(3):
                samples = _scrape(base + rank)
                if not samples or (_value(samples, "ncclx_global_step") or 0) < 2:
                    return False
                during[rank] = samples
            return True

        assert wait_for(every_rank_stepping, 120), job.log()[-4000:]
        for rank, samples in during.items():
            assert _value(samples, "ncclx_watchdog_up", rank=str(rank)) == 1.0
            assert _value(samples, "ncclx_phase", rank=str(rank), phase="train_step") in (0.0, 1.0)
            assert _value(samples, "ncclx_step_seconds", rank=str(rank)) > 0
            assert _value(samples, "ncclx_dumps_written_total", rank=str(rank)) == 0.0

        def stalled() -> bool:
            stuck = _scrape(base + 1)
            return bool(stuck) and (_value(stuck, "ncclx_dumps_written_total") or 0) >= 1 \
                and (_value(stuck, "ncclx_seconds_since_heartbeat") or 0) > 3.0
        assert wait_for(stalled, 120), job.log()[-4000:]
        after: list[dict] = []

        def summarized() -> bool:  # the summarizing rank counts the event's hang kind once its summary is written
            after[:] = [_scrape(base + rank) or {} for rank in range(3)]
            return sum(v for samples in after for (name, _), v in samples.items()
                       if name == "ncclx_hang_kinds_total") == 1.0
        assert wait_for(summarized, 60), after
        assert sum(_value(samples, "ncclx_events", reason="stall") for samples in after) == 1.0  # the starter's
        assert [_value(samples, "ncclx_watchdog_up") for samples in after] == [1.0, 1.0, 1.0]

        def merged() -> bool:
            if not textfile.exists():
                return False
            samples = _samples(textfile.read_text())
            return {_value(samples, "ncclx_dumps_written_total", rank=str(r)) for r in range(3)} == {1.0}
        assert wait_for(merged, 60), textfile.read_text() if textfile.exists() else "no textfile"
        assert not [p for p in textfile.parent.iterdir() if p.name.endswith(".prom") and p != textfile]
    finally:
        job.stop()
