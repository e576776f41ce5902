"""A dump folder that cannot be written (here: its parent is a file) gives one clear error per
reason, not a traceback at every check of the trigger file, and the event's summary line says
no dump was written instead of naming dumps and a verdict (world size 1, injected clock)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.watchdog.runtime import WatchdogRuntime
from support import FakeClock


def test_an_unwritable_dump_folder_is_named_once_and_no_dump_is_claimed(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a-file").write_text("x")
    clock = FakeClock(50.0)
    config = WatchdogConfig(train_step_seconds=5.0, first_step_seconds=5.0, collect_timeout_seconds=1.0,
                            auto={"enabled": False}, on_stall=StallAction.dump)
    runtime = WatchdogRuntime(config, tmp_path / "a-file" / "dumps", clock=clock, exit_fn=lambda code: None)
    caplog.set_level(logging.INFO)
    runtime.heartbeat.train_batch_start()
    for _ in range(5):  # the trigger file is looked for every 2 s
        clock.now += 2.0
        runtime._tick()
    trigger = [r for r in caplog.records if r.name.endswith("triggers")]
    assert len(trigger) == 1 and trigger[0].exc_info is None, [r.getMessage() for r in trigger]
    assert "cannot be used" in trigger[0].getMessage()
    assert runtime.results, "the stall was not handled"
    lines = [r.getMessage() for r in caplog.records if "stall-001:" in r.getMessage()]
    assert any("no dump could be written or read" in line for line in lines), lines
    assert not any("dumps from ranks" in line or "no_hang" in line for line in lines), lines
    assert runtime.results[0].verdict is None
