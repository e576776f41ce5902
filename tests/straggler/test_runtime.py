"""Two ranks' helper threads over one real c10d store: summaries published, scored by rank 0,
one warning, stragglers.json written, threads gone after stop."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_ncclx.events.connection import StoreClient

from lightning_ncclx.config import StragglerConfig
from lightning_ncclx.straggler.runtime import StragglerRuntime
from lightning_ncclx.straggler.timings import StepRecord


def records(forward: float, n: int = 4) -> list[StepRecord]:
    return [StepRecord(data_fetch=0.001, marks={"start": 0.0, "before_backward": forward, "end": forward + 0.001})
            for _ in range(n)]


def test_reader_scores_warns_once_and_writes_the_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = StoreClient(dist.PrefixStore("lightning_ncclx", dist.HashStore()))
    config = StragglerConfig(interval_steps=4, patience=2, poll_interval_seconds=0.05)
    ranks = [StragglerRuntime(config, rank=r, world_size=3, store=store, host=f"h{r}", fit=0, dump_dir=tmp_path)
             for r in range(3)]
    for runtime in ranks:
        runtime.start()
    with caplog.at_level(logging.INFO, logger="lightning_ncclx.straggler"):
        for interval in range(3):
            for runtime in ranks:
                runtime.submit(interval, records(0.15 if runtime.rank == 1 else 0.1))
        for runtime in reversed(ranks):  # rank 0 last: it waits for the others' last interval
            runtime.stop()
    assert not any(t.name.startswith("ncclx-straggler") for t in threading.enumerate())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("straggler: rank 1 on h1: forward 1.50x"), warnings
    document = json.loads((tmp_path / "stragglers.json").read_text())
    assert document["intervals_scored"] == 3 and document["ranks"][0]["rank"] == 1
    assert [i["rank"] for i in document["episodes"]] == [1]
    assert [m["ncclx/straggler/slowest_rank"] for _, m in ranks[0].metrics()] == [1.0, 1.0, 1.0]
    assert ranks[1].metrics() == []  # only the reading rank scores


def test_write_json_for_a_stall_event_folder_on_the_reading_rank_only(tmp_path: Path) -> None:
    store = StoreClient(dist.PrefixStore("lightning_ncclx", dist.HashStore()))
    runtimes = [StragglerRuntime(StragglerConfig(poll_interval_seconds=0.05), rank=r, world_size=2, store=store,
                                 host="h", fit=0, dump_dir=None) for r in (0, 1)]
    for runtime in runtimes:
        runtime.start()
    try:
        path = runtimes[0].write_json(tmp_path / "stall-001")
        assert path == tmp_path / "stall-001" / "stragglers.json"
        assert json.loads(path.read_text())["episodes"] == []
        assert runtimes[1].write_json(tmp_path / "stall-002") is None
    finally:
        for runtime in runtimes:
            runtime.stop()