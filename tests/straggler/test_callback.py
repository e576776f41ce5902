"""``straggler/callback.py``: the ``StragglerDetector`` callback's own rules - when it starts (fit
only, enabled, more than one process: a real 1-rank gloo group leaves it off), how its hooks turn
batches into one submitted interval per ``interval_steps`` batches, the gaps that are not a data
fetch, the scores handed to the Trainer's loggers on the reading rank only (a failing logger
skipped), and stopping. The runtime is real (a ``HashStore``), fed directly, its thread started
only where stopping is the point.

Pickling and the default detector are in ``tests/straggler/test_config_and_attach.py``; real
multi-rank fits in ``tests/straggler/test_straggler_jobs.py``."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from lightning.pytorch.loggers import Logger

from lightning_ncclx.config import StragglerConfig
from lightning_ncclx.straggler import StragglerDetector
from lightning_ncclx.straggler.runtime import StragglerRuntime
from lightning_ncclx.straggler.timings import StepRecorder
from support import FakeClock


@pytest.fixture
def gloo_world(tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class RecordingLogger(Logger):
    """A real Lightning logger that keeps what it is given."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.logged: list[tuple[dict, int | None]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        if self.fail:
            raise OSError("disk full")
        self.logged.append((dict(metrics), step))


def armed(config: StragglerConfig, *, rank: int = 1, clock: FakeClock | None = None) -> tuple[StragglerDetector, StragglerRuntime]:
    """A detector as ``setup`` leaves it in a 2-rank job, its runtime not started (nothing is consumed)."""
    detector = StragglerDetector(config)
    runtime = StragglerRuntime(config, rank=rank, world_size=2, store=dist.HashStore(), host="h", fit=0, dump_dir=None)
    detector._runtime = runtime
    detector._recorder = StepRecorder(clock=clock or FakeClock())
    return detector, runtime


def submitted(runtime: StragglerRuntime) -> list[tuple[int, int]]:
    """(interval, number of records) of everything the callback submitted."""
    out = []
    while not runtime._inbox.empty():
        interval, records = runtime._inbox.get_nowait()
        out.append((interval, len(records)))
    return out


def batch(detector: StragglerDetector, trainer=None, clock: FakeClock | None = None, seconds: float = 0.0) -> None:
    detector.on_train_batch_start(trainer, None, None, 0)
    if clock is not None:
        clock.advance(seconds)
    detector.on_before_backward(trainer, None, None)
    detector.on_after_backward(trainer, None)
    detector.on_before_optimizer_step(trainer, None, None)
    detector.on_train_batch_end(trainer, None, None, None, 0)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_only_fit_starts_detection(gloo_world, stage: str) -> None:
    detector = StragglerDetector(StragglerConfig())
    detector.setup(SimpleNamespace(default_root_dir="."), None, stage)
    assert detector.runtime is None and detector._recorder is None


def test_a_single_process_has_no_peers_and_stays_off(gloo_world) -> None:
    detector = StragglerDetector(StragglerConfig())
    detector.setup(SimpleNamespace(default_root_dir="."), None, "fit")
    assert detector.runtime is None and detector._recorder is None
    batch(detector)  # every hook is a no-op
    assert detector._batches == 0 and detector.write_stragglers_json() is None


def test_a_disabled_or_already_running_detector_is_not_started_again(gloo_world) -> None:
    off = StragglerDetector(StragglerConfig(enabled=False))
    off.setup(SimpleNamespace(default_root_dir="."), None, "fit")
    assert off.runtime is None
    detector, runtime = armed(StragglerConfig())
    detector.setup(SimpleNamespace(default_root_dir="."), None, "fit")
    assert detector.runtime is runtime


def test_one_interval_is_submitted_every_interval_steps_batches() -> None:
    detector, runtime = armed(StragglerConfig(interval_steps=3))
    for _ in range(7):
        batch(detector)
    assert submitted(runtime) == [(0, 3), (1, 3)]
    assert detector._batches == 7 and len(detector._recorder.records) == 1  # the 7th waits for its interval


def test_the_hooks_mark_the_step_and_the_gap_between_batches_is_the_data_fetch() -> None:
    clock = FakeClock(100.0)
    detector, runtime = armed(StragglerConfig(interval_steps=2), clock=clock)
    batch(detector, clock=clock, seconds=0.25)
    clock.advance(0.5)  # waiting for the loader
    batch(detector, clock=clock, seconds=0.25)
    (first, second) = runtime._inbox.get_nowait()[1]
    assert first.data_fetch is None and second.data_fetch == pytest.approx(0.5)
    assert list(second.marks) == ["start", "before_backward", "after_backward", "before_optimizer", "end"]
    assert second.marks["before_backward"] - second.marks["start"] == pytest.approx(0.25)


@pytest.mark.parametrize("hook", ["on_train_epoch_start", "on_validation_start", "on_save_checkpoint"])
def test_epoch_starts_validation_and_checkpoints_are_not_counted_as_data_fetch(hook: str) -> None:
    clock = FakeClock()
    detector, runtime = armed(StragglerConfig(interval_steps=2), clock=clock)
    batch(detector)
    clock.advance(30.0)
    args = {"on_save_checkpoint": (None, None, {}), "on_train_epoch_start": (None, None),
            "on_validation_start": (None, None)}[hook]
    getattr(detector, hook)(*args)
    batch(detector)
    records = runtime._inbox.get_nowait()[1]
    assert [r.data_fetch for r in records] == [None, None]


def test_the_reading_rank_hands_scores_to_every_logger_and_skips_a_failing_one(caplog: pytest.LogCaptureFixture) -> None:
    detector, runtime = armed(StragglerConfig(interval_steps=100), rank=0)
    metrics = {"ncclx/straggler/score_max": 1.4, "ncclx/straggler/slowest_rank": 1.0}
    runtime._metrics.put((4, metrics))
    good, broken = RecordingLogger(), RecordingLogger(fail=True)
    trainer = SimpleNamespace(loggers=[broken, good], global_step=57)
    with caplog.at_level(logging.WARNING, logger="lightning_ncclx.straggler.callback"):
        batch(detector, trainer)
    assert good.logged == [(metrics, 57)]
    assert [r.getMessage() for r in caplog.records] == ["logging straggler scores to RecordingLogger failed"]
    batch(detector, trainer)
    assert good.logged == [(metrics, 57)]  # each interval's scores once


def test_other_ranks_log_nothing() -> None:
    detector, runtime = armed(StragglerConfig(interval_steps=100), rank=1)
    runtime._metrics.put((0, {"ncclx/straggler/score_max": 2.0}))
    logger = RecordingLogger()
    batch(detector, SimpleNamespace(loggers=[logger], global_step=1))
    assert logger.logged == []


@pytest.mark.parametrize("end", ["teardown", "on_exception"])
def test_teardown_or_an_exception_stops_the_thread_and_forgets_the_runtime(end: str) -> None:
    config = StragglerConfig(interval_steps=2, poll_interval_seconds=0.01)
    detector, runtime = armed(config, rank=1)
    runtime.start()
    thread = runtime._thread
    assert thread.is_alive()
    if end == "teardown":
        detector.teardown(None, None, "fit")
    else:
        detector.on_exception(None, None, RuntimeError("boom"))
    assert not thread.is_alive() and thread not in threading.enumerate()
    assert detector.runtime is None and detector._recorder is None
    batch(detector)  # hooks after the end do nothing
    assert detector._batches == 0


def test_write_stragglers_json_on_the_reading_rank_only(tmp_path: Path) -> None:
    reader, _ = armed(StragglerConfig(), rank=0)
    path = reader.write_stragglers_json(tmp_path / "stall-001")
    assert path == tmp_path / "stall-001" / "stragglers.json" and path.is_file()
    other, _ = armed(StragglerConfig(), rank=1)
    assert other.write_stragglers_json(tmp_path / "stall-002") is None
    assert not (tmp_path / "stall-002").exists()
