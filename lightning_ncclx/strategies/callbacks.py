"""Attach the stall watchdog and straggler detection a strategy brings by default, without doubling a
user's own."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning_ncclx.config import NcclxConfig

log = logging.getLogger(__name__)


def attach_default_watchdog(trainer: Any, ncclx: NcclxConfig, dump_dir: Path | None) -> Any:
    """Add a ``StallWatchdog`` to ``trainer.callbacks`` unless one is there; returns the one in use.

    A watchdog the user added keeps its own settings; it only learns the run's dump folder and
    ``ncclx.alerts`` when it has none of its own."""
    from lightning_ncclx.watchdog import StallWatchdog

    for callback in trainer.callbacks:
        if isinstance(callback, StallWatchdog):
            if getattr(callback, "dump_dir", None) is None and dump_dir is not None:
                callback.dump_dir = dump_dir
            if getattr(callback, "alerts", None) is None:
                callback.alerts = ncclx.alerts
            attach_metrics_exporter(trainer, ncclx)
            return callback
    watchdog = StallWatchdog(ncclx.watchdog, dump_dir=dump_dir, flight_recorder=ncclx.flight_recorder,
                             alerts=ncclx.alerts)
    trainer.callbacks.append(watchdog)
    attach_metrics_exporter(trainer, ncclx)
    return watchdog


def attach_metrics_exporter(trainer: Any, ncclx: NcclxConfig) -> Any:
    """Add a ``MetricsExporter`` when ``ncclx.metrics`` names a port or a textfile (and none is
    there); None otherwise: nothing is imported when metrics are off."""
    if not ncclx.metrics.enabled:
        return None
    from lightning_ncclx.metrics import MetricsExporter

    for callback in trainer.callbacks:
        if isinstance(callback, MetricsExporter):
            return callback
    exporter = MetricsExporter(ncclx.metrics)
    trainer.callbacks.append(exporter)
    return exporter


def attach_default_straggler_detector(trainer: Any, ncclx: NcclxConfig, dump_dir: Path | None) -> Any:
    """Add a ``StragglerDetector`` to ``trainer.callbacks`` unless one is there; returns the one in use
    (one the user added learns ``ncclx.alerts`` when it has none of its own)."""
    from lightning_ncclx.straggler import StragglerDetector

    for callback in trainer.callbacks:
        if isinstance(callback, StragglerDetector):
            if getattr(callback, "dump_dir", None) is None and dump_dir is not None:
                callback.dump_dir = dump_dir
            if getattr(callback, "alerts", None) is None:
                callback.alerts = ncclx.alerts
            return callback
    detector = StragglerDetector(ncclx.straggler, dump_dir=dump_dir, flight_recorder=ncclx.flight_recorder,
                                 alerts=ncclx.alerts)
    trainer.callbacks.append(detector)
    return detector
