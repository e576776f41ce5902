"""``StragglerDetector``: the Lightning callback that times each rank's steps and names a slow rank.

Example::

    from lightning.pytorch import Trainer
    from lightning_ncclx.config import StragglerConfig
    from lightning_ncclx.straggler import StragglerDetector

    trainer = Trainer(strategy="ddp", callbacks=[StragglerDetector(StragglerConfig(interval_steps=50))])

The hooks take a clock reading (or record a CUDA event); once per ``interval_steps`` batches the
readings go to a helper thread (see ``runtime``). Nothing is created before ``setup``, so the
callback pickles for ``ddp_spawn``. With one process there are no peers: it does nothing.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_ncclx.config import AlertsConfig, FlightRecorderConfig, StragglerConfig
from lightning_ncclx.dump.location import resolve_dump_dir
from lightning_ncclx.straggler.runtime import StragglerRuntime
from lightning_ncclx.straggler.timings import StepRecorder

log = logging.getLogger(__name__)

_fits = itertools.count()
"""Fits started in this process; every rank runs the same sequence, so it keys the store."""


class StragglerDetector(Callback):
    """Names the rank (and host, and part of the step) that keeps the others waiting.

    Args:
        config: interval, threshold, patience (default ``StragglerConfig()``).
        dump_dir: where ``stragglers.json`` goes; default ``resolve_dump_dir(flight_recorder.dump_dir,
            trainer.default_root_dir)``, the run's dump folder.
        flight_recorder: read for ``dump_dir`` only.
        alerts: where a straggler warning goes when ``alerts.stragglers`` is on (default: none).
    """

    def __init__(self, config: StragglerConfig | None = None, *, dump_dir: str | os.PathLike[str] | None = None,
                 flight_recorder: FlightRecorderConfig | None = None, alerts: AlertsConfig | None = None) -> None:
        self.config = config if config is not None else StragglerConfig()
        self.alerts = alerts
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.flight_recorder = flight_recorder if flight_recorder is not None else FlightRecorderConfig()
        self._runtime: StragglerRuntime | None = None
        self._recorder: StepRecorder | None = None
        self._batches = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runtime"] = None  # threads, queues and store clients never cross a pickle
        state["_recorder"] = None
        return state

    @property
    def runtime(self) -> StragglerRuntime | None:
        """The running detection of this process (None outside fit, when disabled or alone)."""
        return self._runtime

    def write_stragglers_json(self, folder: str | os.PathLike[str] | None = None) -> Path | None:
        """Write ``stragglers.json`` into ``folder`` (default the run's dump folder), on the reading rank."""
        runtime = self._runtime
        return runtime.write_json(Path(folder) if folder is not None else None) if runtime is not None else None

    # ------------------------------------------------------------------------------ life cycle
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or not self.config.enabled or self._runtime is not None:
            return
        try:
            self._start(trainer, pl_module)
        except Exception:  # noqa: BLE001 - detection that cannot start must not stop training
            log.warning("straggler detection could not start; training continues without it", exc_info=True)

    def _start(self, trainer: Any, pl_module: Any) -> None:
        import torch.distributed as dist

        from lightning_ncclx.backend.torch_api import default_store
        from lightning_ncclx.dump.writer import host_name
        from lightning_ncclx.events.connection import shared_client

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            log.debug("straggler detection: a single process has no peers to compare with; off")
            return
        fit = next(_fits)
        rank, world = dist.get_rank(), dist.get_world_size()
        dump_dir = self.dump_dir.absolute() if self.dump_dir is not None else resolve_dump_dir(
            self.flight_recorder.dump_dir, getattr(trainer, "default_root_dir", None))
        cuda = self.config.cuda_events and getattr(getattr(pl_module, "device", None), "type", "cpu") == "cuda"
        self._recorder = StepRecorder(use_cuda_events=cuda)
        self._batches = 0
        store = shared_client(default_store(), op_timeout_seconds=self.config.poll_interval_seconds)
        runtime = StragglerRuntime(self.config, rank=rank, world_size=world, store=store, host=host_name(),
                                   fit=fit, dump_dir=dump_dir, alerts=getattr(self, "alerts", None))
        runtime.start()
        self._runtime = runtime
        if rank == 0:
            log.info("straggler detection on: %d ranks compared every %d batches (threshold %.2fx for %d intervals, "
                     "%s timings); stragglers.json -> %s", world, self.config.interval_steps, self.config.threshold,
                     self.config.patience, "CUDA-event" if cuda else "CPU-clock", dump_dir)

    def _stop(self, trainer: Any) -> None:
        runtime, self._runtime = self._runtime, None
        self._recorder = None
        if runtime is None:
            return
        try:
            runtime.stop()
        except Exception:  # noqa: BLE001
            log.warning("stopping straggler detection failed", exc_info=True)
        from lightning_ncclx.events.connection import release_client

        release_client(runtime.store)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop(trainer)

    # ------------------------------------------------------------------------------ timings
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._recorder is not None:
            self._recorder.batch_start()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._recorder is not None:
            self._recorder.mark("before_backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self._recorder is not None:
            self._recorder.mark("after_backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._recorder is not None:
            self._recorder.mark("before_optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        recorder, runtime = self._recorder, self._runtime
        if recorder is None or runtime is None:
            return
        recorder.batch_end()
        self._batches += 1
        if self._batches % self.config.interval_steps == 0:
            runtime.submit(self._batches // self.config.interval_steps - 1, recorder.take())
        if runtime.reader:
            self._log_metrics(trainer, runtime)

    # Gaps that are not a loader fetch: an epoch boundary, validation, a checkpoint save.
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._forget_fetch()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._forget_fetch()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._forget_fetch()

    def _forget_fetch(self) -> None:
        if self._recorder is not None:
            self._recorder.forget_fetch()

    @staticmethod
    def _log_metrics(trainer: Any, runtime: StragglerRuntime) -> None:
        for interval, metrics in runtime.metrics():
            for logger in list(getattr(trainer, "loggers", []) or []):
                try:
                    logger.log_metrics(metrics, step=int(getattr(trainer, "global_step", interval)))
                except Exception:  # noqa: BLE001 - a failing logger must not stop training
                    log.warning("logging straggler scores to %s failed", type(logger).__name__, exc_info=True)
