"""The watchdog runtime and callback in one process (world size 1, in-memory store), driven by
an injected clock: stall, on-demand and exception events, pickling, signal handling, shutdown."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.watchdog import StallWatchdog
from lightning_ncclx.watchdog.heartbeat import Phase
from lightning_ncclx.watchdog.runtime import WatchdogRuntime
from support import FakeClock


def make_runtime(tmp_path: Path, **overrides) -> tuple[WatchdogRuntime, FakeClock, list[int]]:
    values = dict(train_step_seconds=5.0, first_step_seconds=5.0, collect_timeout_seconds=1.0,
                  auto={"enabled": False}, on_stall=StallAction.dump_and_exit)
    values.update(overrides)
    clock, exits = FakeClock(50.0), []
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


def test_a_stall_that_ends_is_marked_recovered_and_does_not_count_against_the_cap(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump, max_dumps_per_run=1)
    for _ in range(3):
        runtime.heartbeat.train_batch_start()
        runtime._tick()  # moved on: the stall before (if any) recovered
        clock.now += 6.0
        runtime._tick()
        runtime._tick()  # the same stall alarms once
    runtime.heartbeat.train_batch_start()
    runtime._tick()
    names = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert names == ["stall-001", "stall-002", "stall-003"] and exits == []
    for name in names:
        collection = json.loads((tmp_path / "dumps" / name / "collection.json").read_text())
        assert collection["recovery"]["recovered"] is True
        assert collection["recovery"]["lasted_seconds"] == pytest.approx(6.0)
    assert runtime.stall_events == 0 and runtime.participation.recovered_events == 3


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


def _wait_for(path: Path, seconds: float = 60.0) -> bool:
    """Poll for ``path`` (a bound so a broken trigger fails instead of hanging the suite)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigusr2_reaches_the_watchdog_thread_and_chains_the_users_handler(tmp_path: Path) -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    runtime, clock, exits = make_runtime(tmp_path, poll_interval_seconds=5.0)
    try:
        runtime.start()
        assert signal.getsignal(signal.SIGUSR2) != previous
        os.kill(os.getpid(), signal.SIGUSR2)
        context = tmp_path / "dumps" / "ondemand-001" / "rank_00000.context.json"
        assert _wait_for(context), "the watchdog thread never dumped"
    finally:
        runtime.stop()
        user_handler = signal.signal(signal.SIGUSR2, previous)
    assert calls == [signal.SIGUSR2]  # the user's handler still ran, once
    assert user_handler is not runtime._wakeup._handler  # and is back in place after stop
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd is given back
    assert not runtime._thread.is_alive()
    ctx = json.loads(context.read_text())
    assert ctx["reason"] == "on_demand" and exits == []


BLOCKED_MAIN_THREAD = """
import ctypes, sys
from pathlib import Path
from lightning_ncclx.config import WatchdogConfig
from lightning_ncclx.watchdog.runtime import WatchdogRuntime

runtime = WatchdogRuntime(WatchdogConfig(poll_interval_seconds=5.0), Path(sys.argv[1]))
runtime.start()
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on glibc
libc.pthread_mutex_lock(mutex)
Path(sys.argv[2]).write_text("blocked")
libc.pthread_mutex_lock(mutex)  # relock: blocks forever in C, no signal ends it, no Python runs
"""


def test_sigusr2_dumps_while_the_main_thread_is_blocked_in_native_code(tmp_path: Path) -> None:
    """The main thread never runs Python again (as in a hung collective): the dump still comes."""
    from support import clean_env, kill_session

    marker = tmp_path / "blocked"
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_MAIN_THREAD, str(tmp_path / "dumps"), str(marker)],
                            env=clean_env(), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert _wait_for(marker), proc.communicate(timeout=5)[0] if proc.poll() is not None else "never blocked"
        os.kill(proc.pid, signal.SIGUSR2)
        assert _wait_for(tmp_path / "dumps" / "ondemand-001" / "rank_00000.context.json"), "no dump while blocked"
        assert proc.poll() is None  # the job goes on (blocked, as it was)
    finally:
        kill_session(proc)
        proc.wait()


def test_dump_now_file_triggers_an_on_demand_dump(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump)
    runtime.heartbeat.beat(Phase.idle)
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "DUMP_NOW").touch()
    runtime._tick()
    assert (tmp_path / "dumps" / "ondemand-001" / "rank_00000.context.json").is_file()
    assert not (tmp_path / "dumps" / "DUMP_NOW").exists()  # taken: it does not fire again
    clock.now += 10.0
    runtime._tick()
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["ondemand-001"]


def test_on_demand_dumps_are_bounded(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump, max_on_demand_dumps=2)
    runtime.heartbeat.beat(Phase.idle)
    for _ in range(4):
        runtime._signal_requested = True
        runtime._tick()
        clock.now += 10.0
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["ondemand-001", "ondemand-002"]


def test_a_stall_after_an_on_demand_dump_is_still_reported(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump)
    runtime.heartbeat.train_batch_start()
    clock.now += 1.0
    runtime._signal_requested = True
    runtime._tick()  # on-demand dump in the middle of the step
    clock.now += 5.0  # the same step, now 6 s old: over the 5 s threshold
    runtime._tick()
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["ondemand-001", "stall-002"]


def test_event_keys_are_deleted_from_the_store_after_the_summary(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump)
    runtime._signal_requested = True
    runtime._tick()
    store = runtime.coordinator.client
    left = [k for k in ("ev/1/dumped", "ev/1/gone", "ev/1/rank/0", "ev/1/roster", "ev/1/blob/0", "ev/1/outcome",
                        "ev/1/leaving") if store.check([k])]
    assert left == []
    assert json.loads(store.get("ev/1/meta"))["closed"] is True


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


def _fit(trainer_module, callback, tmp_path: Path):
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
    return trainer


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
    fds_before = set(os.listdir("/proc/self/fd"))
    handler_before = signal.getsignal(signal.SIGUSR2)
    trainer = _fit(module, callback, tmp_path)
    assert len(seen) == 6 and seen[0].heartbeat.batches == 6
    assert callback.runtime is None
    assert not [t for t in threading.enumerate() if t.name.startswith("ncclx-watchdog")]
    assert not (tmp_path / "dumps").exists()  # nothing dumped: no folder, no native-stacks file
    assert signal.getsignal(signal.SIGUSR2) == handler_before
    assert signal.set_wakeup_fd(-1) == -1
    leaked = {fd for fd in set(os.listdir("/proc/self/fd")) - fds_before if os.path.exists(f"/proc/self/fd/{fd}")}
    assert not leaked, [os.readlink(f"/proc/self/fd/{fd}") for fd in leaked]
    assert "save_checkpoint" not in vars(trainer)  # the Trainer's own method again


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


def test_a_step_that_is_compiling_gets_the_first_step_threshold(tmp_path: Path) -> None:
    """A recompile after a shape change can come at any step: while the main thread's stack is
    in torch's compiler, the step gets first_step_seconds (20 s) instead of 5 s."""
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump, first_step_seconds=20.0)
    runtime.heartbeat.train_batch_start()
    runtime.heartbeat.train_batch_end()
    runtime.heartbeat.train_batch_start()  # the second step: train_step phase, 5 s threshold
    tick_while_compiling = compile("runtime._tick()", "/site-packages/torch/_dynamo/convert_frame.py", "exec")
    clock.now += 6.0
    exec(tick_while_compiling, {"runtime": runtime})
    assert not (tmp_path / "dumps").exists()
    runtime._tick()  # the same 6 s step, not compiling: a stall
    assert [p.name for p in (tmp_path / "dumps").iterdir()] == ["stall-001"]


def test_a_compile_longer_than_first_step_seconds_is_a_stall(tmp_path: Path) -> None:
    runtime, clock, exits = make_runtime(tmp_path, on_stall=StallAction.dump, first_step_seconds=20.0)
    runtime.heartbeat.train_batch_start()
    runtime.heartbeat.train_batch_end()
    runtime.heartbeat.train_batch_start()
    clock.now += 21.0
    exec(compile("runtime._tick()", "/site-packages/torch/_inductor/compile_fx.py", "exec"), {"runtime": runtime})
    assert [p.name for p in (tmp_path / "dumps").iterdir()] == ["stall-001"]
