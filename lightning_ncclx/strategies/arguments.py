"""Lightning's own ``timeout=`` and ``process_group_backend=`` arguments, expressed in ``ncclx``.

Lightning's strategies have one collective timeout and one backend string; lightning-ncclx has two
timeout phases (``ncclx.timeouts``) and a checked backend choice (``ncclx.backend``). This module is
the one place that folds the former into the latter, so every strategy (Lightning, Fabric and the
``pytorch_lightning`` flavour) treats them alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

from lightning_ncclx.config import BACKEND_CHOICES, NcclxConfig, TimeoutConfig, WatchdogConfig
from lightning_ncclx.errors import ConfigError

log = logging.getLogger(__name__)

# Watchdog thresholds and the timeout phase each one races (see config._check_stall_shorter_than_timeout).
_RACES = {
    "first_step_seconds": "init_timeout_seconds",
    "train_step_seconds": "training_timeout_seconds",
    "validation_seconds": "training_timeout_seconds",
    "checkpoint_seconds": "training_timeout_seconds",
}


@dataclass(frozen=True)
class FoldedArguments:
    """The strategy's effective ``ncclx`` settings and a backend name passed through unchecked."""

    ncclx: NcclxConfig
    passthrough_backend: str | None
    """A ``process_group_backend`` torch may know but ``ncclx.backend`` does not (``"mpi"``,
    ``"ucc"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``...): handed to ``init_process_group`` as is."""


def fold_lightning_arguments(
    owner: str, ncclx: NcclxConfig, timeout: timedelta | float | None, process_group_backend: str | None
) -> FoldedArguments:
    """``timeout`` and ``process_group_backend`` of Lightning's constructors, folded into ``ncclx``."""
    config, passthrough = _fold_backend(owner, ncclx, process_group_backend)
    return FoldedArguments(_fold_timeout(owner, config, timeout), passthrough)


def _fold_backend(owner: str, config: NcclxConfig, backend: str | None) -> tuple[NcclxConfig, str | None]:
    if backend is None or backend in ("auto", config.backend):
        return config, None
    if config.backend != "auto":
        raise ConfigError(
            f"{owner}(process_group_backend={backend!r}) disagrees with ncclx.backend={config.backend!r}: set one of them"
        )
    if backend in BACKEND_CHOICES:
        return replace(config, backend=backend), None
    return config, backend


def _seconds(owner: str, timeout: timedelta | float) -> float:
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    raise ConfigError(f"{owner}(timeout={timeout!r}) is not valid: expected a datetime.timedelta or seconds")


def _fold_timeout(owner: str, config: NcclxConfig, timeout: timedelta | float | None) -> NcclxConfig:
    """``timeout=T`` is the start-up phase (``init_timeout_seconds=T``: group creation and the first
    ``warmup_steps`` batches); the training phase is then ``min(training_timeout_seconds, T)``, so
    no collective waits longer than ``T``, as with Lightning's single timeout."""
    if timeout is None:
        return config
    seconds = _seconds(owner, timeout)
    configured = config.timeouts.init_timeout_seconds
    if configured != TimeoutConfig().init_timeout_seconds and configured != seconds:
        raise ConfigError(
            f"{owner}(timeout={seconds:g} s) disagrees with ncclx.timeouts.init_timeout_seconds={configured:g}: "
            "set one of them"
        )
    timeouts = replace(
        config.timeouts,
        init_timeout_seconds=seconds,
        training_timeout_seconds=min(config.timeouts.training_timeout_seconds, seconds),
    )
    watchdog = _watchdog_within(owner, config.watchdog, timeouts) if config.watchdog.enabled else config.watchdog
    return replace(config, timeouts=timeouts, watchdog=watchdog)


def _watchdog_within(owner: str, watchdog: WatchdogConfig, timeouts: TimeoutConfig) -> WatchdogConfig:
    """Lower the *default* stall thresholds that would not fire before ``timeouts`` abort the job
    to half that timeout (a threshold the user set keeps its value, and NcclxConfig names the clash)."""
    defaults = {f.name: getattr(WatchdogConfig(), f.name) for f in fields(WatchdogConfig)}
    lowered: dict[str, Any] = {}
    for threshold, phase in _RACES.items():
        value, limit = getattr(watchdog, threshold, None), getattr(timeouts, phase)
        if value is not None and value >= limit and value == defaults[threshold]:
            lowered[threshold] = limit / 2
    if not lowered:
        return watchdog
    step = lowered.get("train_step_seconds", watchdog.train_step_seconds)
    auto = watchdog.auto
    if auto.enabled and auto.floor_seconds > step:
        auto = replace(auto, floor_seconds=step)
    log.info(
        "%s: timeout=%g s: stall thresholds lowered to half the timeout they race (%s)",
        owner,
        timeouts.init_timeout_seconds,
        ", ".join(f"ncclx.watchdog.{k}={v:g}" for k, v in lowered.items()),
    )
    return replace(watchdog, auto=auto, **lowered)
