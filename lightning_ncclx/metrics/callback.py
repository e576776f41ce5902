"""``MetricsExporter``: the Lightning callback that serves this rank's metrics and/or writes its
part of the host's node_exporter textfile. Added by the ncclx strategies when ``ncclx.metrics``
names a port or a textfile; its per-step work is two clock reads.

Example::

    from lightning_ncclx.config import MetricsConfig
    from lightning_ncclx.metrics import MetricsExporter

    trainer = Trainer(strategy="ddp_ncclx", callbacks=[MetricsExporter(MetricsConfig(port=9400))])
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_ncclx.config import MetricsConfig
from lightning_ncclx.metrics.snapshot import rank_snapshot

log = logging.getLogger(__name__)


def _runtime_of(trainer: Any, attribute: str) -> Any:
    """The running ``WatchdogRuntime`` (``"watchdog"``) or ``StragglerRuntime`` of this Trainer's callbacks."""
    from lightning_ncclx.straggler import StragglerDetector
    from lightning_ncclx.watchdog import StallWatchdog

    wanted = StallWatchdog if attribute == "watchdog" else StragglerDetector
    for callback in list(getattr(trainer, "callbacks", None) or []):
        if isinstance(callback, wanted):
            return callback.runtime
    return None


class MetricsExporter(Callback):
    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self._trainer: Any = None
        self._server: Any = None
        self._textfile: Any = None
        self._batch_start: float | None = None
        self.step_seconds: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_trainer=None, _server=None, _textfile=None)  # servers and threads never cross a pickle
        return state

    def snapshots(self) -> list[dict[str, Any]]:
        trainer = self._trainer
        if trainer is None:
            return []
        try:
            return [rank_snapshot(rank=int(trainer.global_rank), local_rank=int(trainer.local_rank),
                                  watchdog=_runtime_of(trainer, "watchdog"),
                                  straggler=_runtime_of(trainer, "straggler"),
                                  global_step=int(trainer.global_step), step_seconds=self.step_seconds)]
        except Exception:  # noqa: BLE001 - a scrape must not raise into the server's thread
            log.debug("reading the metrics failed", exc_info=True)
            return []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.config.enabled or self._trainer is not None:
            return
        self._trainer = trainer
        try:
            if self.config.port is not None:
                from lightning_ncclx.metrics.server import MetricsServer

                self._server = MetricsServer(self.config.address, self.config.port + int(trainer.local_rank),
                                             self.snapshots)
            if self.config.textfile is not None:
                from lightning_ncclx.metrics.textfile import TextfileWriter

                self._textfile = TextfileWriter(Path(self.config.textfile), self.config.interval_seconds,
                                                self.snapshots, int(trainer.global_rank))
                self._textfile.start()
        except ImportError:
            log.warning("ncclx.metrics is set but prometheus_client is not installed (pip install "
                        "'lightning-ncclx[metrics]'): no metrics; training continues")
        except Exception:  # noqa: BLE001 - a port in use, a folder not writable: training continues
            log.warning("the metrics exporter could not start; training continues without it", exc_info=True)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch_start = time.monotonic()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._batch_start is not None:
            self.step_seconds = time.monotonic() - self._batch_start

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        textfile, self._textfile = self._textfile, None
        if textfile is not None:
            textfile.stop()
        self._trainer = None
