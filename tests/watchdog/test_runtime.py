"""The watchdog runtime and callback in one process (world size 1, in-memory store), driven by
an injected clock: stall, on-demand and exception events, pickling, signal handling, shutdown."""

from __future__ import annotations

import json
import os
import pickle
import signal
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.watchdog import StallWatchdog
from lightning_ncclx.watchdog.heartbeat import Phase
from lightning_ncclx.watchdog.runtime import WatchdogRuntime


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def make_runtime(tmp_path: Path, **overrides) -> tuple[WatchdogRuntime, FakeClock, list[int]]:
    values = dict(train_step_seconds=5.0, first_step_seconds=5.0, collect_timeout_seconds=1.0,
                  auto={"enabled": False}, on_stall=StallAction.dump_and_exit)
    values.update(overrides)
    clock, exits = FakeClock(), []
    runtime = WatchdogRuntime(WatchdogConfig(**values), tmp_path / "dumps", clock=clock, exit_fn=exits.append)
    return runtime, clock, exits


def test_stall_dumps_summarizes_and_exits(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path)
    runtime.heartbeat.train_batch_start()
    runtime._tick()
    assert not (tmp_path / "dumps").exists()
    clock.now += 6.0
    runtime._tick()
    folder = tmp_path / "dumps" / "stall-001"
    ctx = json.loads((folder / "rank_00000.context.json").read_text())
    assert (ctx["reason"], ctx["initiator_rank"], ctx["phase"]) == ("stall", 0, "first_step")
    assert ctx["seconds_since_heartbeat"] == pytest.approx(6.0)
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["dumped_ranks"] == [0] and collection["missing_ranks"] == []
    assert exits == [75]


def test_dump_mode_keeps_running_and_caps_the_number_of_dumps(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump, max_dumps_per_run=1)
    for _ in range(3):
        runtime.heartbeat.train_batch_start()
        clock.now += 6.0
        runtime._tick()
        runtime._tick()  # the same stall alarms once
    assert [p.name for p in (tmp_path / "dumps").iterdir()] == ["stall-001"] and exits == []


def test_on_exception_dumps_without_exiting(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path)
    runtime.on_exception(ValueError("boom"))
    ctx = json.loads((tmp_path / "dumps" / "exception-rank0-001" / "rank_00000.context.json").read_text())
    assert ctx["reason"] == "exception" and ctx["exception"] == "ValueError: boom"
    assert exits == []  # the exception itself ends this rank


def test_keyboard_interrupt_is_not_an_exception_dump(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path)
    runtime.on_exception(KeyboardInterrupt())
    assert not (tmp_path / "dumps").exists()


def test_sigusr2_sets_a_flag_and_the_thread_dumps(tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGUSR2)
    runtime, clock, exits = make_runtime(tmp_path, poll_interval_seconds=5.0)
    runtime.start()
    try:
        assert signal.getsignal(signal.SIGUSR2) == runtime._on_signal
        os.kill(os.getpid(), signal.SIGUSR2)
        assert runtime._signal_requested
        runtime._tick()  # what the thread does at its next poll
    finally:
        runtime.stop()
    assert signal.getsignal(signal.SIGUSR2) == previous
    assert not runtime._thread.is_alive()
    ctx = json.loads((tmp_path / "dumps" / "ondemand-001" / "rank_00000.context.json").read_text())
    assert ctx["reason"] == "on_demand" and exits == []


def test_idle_phase_never_dumps(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path)
    runtime.heartbeat.beat(Phase.idle)
    clock.now += 1e6
    runtime._tick()
    assert not (tmp_path / "dumps").exists()


def test_callback_pickles_before_and_after_setup(tmp_path: Path) -> None:
    callback = StallWatchdog(WatchdogConfig(train_step_seconds=30.0), dump_dir=tmp_path)
    clone = pickle.loads(pickle.dumps(callback))
    assert clone.config == callback.config and clone.runtime is None
    callback._runtime = object()  # a live runtime never crosses a pickle
    assert pickle.loads(pickle.dumps(callback)).runtime is None


def _fit(trainer_module, callback, tmp_path: Path) -> None:
    class Model(trainer_module.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    trainer = trainer_module.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=1, callbacks=[callback],
                                     logger=False, enable_progress_bar=False, enable_checkpointing=False,
                                     enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path)
    trainer.fit(Model(), data, data)


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_single_process_fit_beats_and_stops_its_thread(tmp_path: Path, package: str) -> None:
    module = pytest.importorskip(package)
    callback = StallWatchdog(WatchdogConfig(poll_interval_seconds=0.05), dump_dir=tmp_path / "dumps")
    seen: list[WatchdogRuntime] = []
    original = callback.on_train_batch_end

    def spy(*args, **kwargs):
        seen.append(callback.runtime)
        return original(*args, **kwargs)

    callback.on_train_batch_end = spy
    _fit(module, callback, tmp_path)
    assert len(seen) == 6 and seen[0].heartbeat.batches == 6
    assert callback.runtime is None
    assert not [t for t in threading.enumerate() if t.name.startswith("ncclx-watchdog")]
    assert not (tmp_path / "dumps").exists()


def test_default_dump_dir_follows_default_root_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("LIGHTNING_NCCLX_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)

    class T:
        default_root_dir = str(tmp_path)

    assert StallWatchdog().resolved_dump_dir(T()) == tmp_path / "ncclx_dumps"


def test_an_earlier_runs_event_folder_is_not_reused(tmp_path: Path) -> None:
    (tmp_path / "dumps" / "stall-001").mkdir(parents=True)
    runtime, clock, exits = make_runtime(tmp_path)
    runtime.heartbeat.train_batch_start()
    clock.now += 6.0
    runtime._tick()
    names = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert len(names) == 2 and names[1].startswith("stall-001-")
    assert not list((tmp_path / "dumps" / "stall-001").iterdir())
