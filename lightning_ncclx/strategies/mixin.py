"""The behaviour every ncclx strategy shares, on top of any Lightning parallel strategy.

Order on every rank, in ``setup_environment`` (the earliest hook that runs in every launch mode):
resolve the backend (refusing what cannot be served) -> resolve and check the dump folder ->
export the flight-recorder variables -> set the start-up timeout -> attach the watchdog ->
create the process group (Lightning) -> log what actually serves the job (rank 0).
After ``timeouts.warmup_steps`` training batches the shorter training timeout is applied on
all ranks together.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

from lightning_ncclx.backend.recorder_env import apply_recorder_env
from lightning_ncclx.backend.resolve import (
    BackendCapabilities,
    is_nccl_family,
    probe_capabilities,
    resolve_backend,
)
from lightning_ncclx.backend.timeouts import TimeoutSchedule, apply_timeout_to_all_groups
from lightning_ncclx.config import NcclxConfig, ncclx_config_from
from lightning_ncclx.dump.location import RUN_ID_VARIABLE, resolve_dump_dir, run_id_from_environment, torch_dump_prefix
from lightning_ncclx.errors import ConfigError

from lightning_ncclx.log_setup import ensure_visible_logging

log = logging.getLogger(__name__)
ensure_visible_logging()


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def check_writable_folder(folder: Path, key: str) -> None:
    """Create ``folder`` and prove a file can be written there, or raise ConfigError naming ``key``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"{key}: the dump folder {str(folder)!r} is not writable ({err.strerror or err})") from None


class NcclxStrategyMixin:
    """Mixed in before a Lightning strategy class (``class X(NcclxStrategyMixin, DDPStrategy)``)."""

    strategy_name = "ncclx"
    attaches_watchdog = True

    # Set by _ncclx_init; declared for type checkers.
    ncclx: NcclxConfig
    _ncclx_backend: str | None
    _ncclx_dump_dir: Path | None
    _ncclx_schedule: TimeoutSchedule | None

    def __init__(self, *args: Any, ncclx: NcclxConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._ncclx_init(ncclx, kwargs)
        super().__init__(*args, **kwargs)

    def _configure_launcher(self) -> None:
        self._ncclx_before_launch()
        super()._configure_launcher()  # type: ignore[misc]

    def setup_environment(self) -> None:
        self._ncclx_prepare_environment()
        super().setup_environment()  # type: ignore[misc]
        self._ncclx_after_group()

    def _get_process_group_backend(self) -> str:
        return self._ncclx_backend or self._ncclx_resolve_backend()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]
        self._ncclx_on_train_batch_start()

    def _ncclx_init(self, ncclx: NcclxConfig | Mapping[str, Any] | None, kwargs: dict[str, Any]) -> None:
        for reserved, instead in (("timeout", "ncclx.timeouts.init_timeout_seconds"), ("process_group_backend", "ncclx.backend")):
            if kwargs.get(reserved) is not None:
                raise ConfigError(f"{type(self).__name__}({reserved}=...) is set through {instead} instead")
            kwargs.pop(reserved, None)
        self.ncclx = ncclx_config_from(ncclx)
        self._ncclx_backend = None
        self._ncclx_dump_dir = None
        self._ncclx_schedule = None
        kwargs["timeout"] = timedelta(seconds=self.ncclx.timeouts.init_timeout_seconds)

    # ----------------------------------------------------------------- before the process group
    @property
    def ncclx_dump_dir(self) -> Path | None:
        """The run's dump folder, known once ``setup_environment`` has run."""
        return self._ncclx_dump_dir

    def _ncclx_resolve_backend(self, caps: BackendCapabilities | None = None) -> str:
        device_type = self.root_device.type  # type: ignore[attr-defined]
        return resolve_backend(self.ncclx.backend, device_type, caps or probe_capabilities())

    def _ncclx_before_launch(self) -> None:
        """In the launching process: refuse an unservable backend before any child starts, and
        give every rank of this run one run id (children inherit the environment)."""
        self._ncclx_backend = self._ncclx_resolve_backend()
        configured = self.ncclx.flight_recorder.dump_dir
        if configured is not None:
            check_writable_folder(resolve_dump_dir(configured, None), "ncclx.flight_recorder.dump_dir")
        if run_id_from_environment() is None:
            os.environ[RUN_ID_VARIABLE] = new_run_id()

    def _ncclx_trainer(self) -> Any:
        """The Trainer driving this strategy (None under Fabric or before connect)."""
        module = getattr(self, "lightning_module", None)
        return getattr(module, "_trainer", None) if module is not None else None

    def _ncclx_prepare_environment(self) -> None:
        self._ncclx_backend = self._ncclx_resolve_backend()
        self._process_group_backend = self._ncclx_backend  # type: ignore[attr-defined]
        recorder = self.ncclx.flight_recorder
        dump_dir = resolve_dump_dir(recorder.dump_dir, getattr(self._ncclx_trainer(), "default_root_dir", None))
        prefix = torch_dump_prefix(dump_dir, recorder.torch_dump_prefix)
        check_writable_folder(prefix.parent, "ncclx.flight_recorder.dump_dir")
        self._ncclx_dump_dir = dump_dir
        apply_recorder_env(recorder, prefix)
        self._timeout = timedelta(seconds=self.ncclx.timeouts.init_timeout_seconds)  # type: ignore[attr-defined]
        timeouts = self.ncclx.timeouts
        self._ncclx_schedule = TimeoutSchedule(
            timedelta(seconds=timeouts.init_timeout_seconds),
            timedelta(seconds=timeouts.training_timeout_seconds),
            timeouts.warmup_steps,
        )
        if self.attaches_watchdog and self.ncclx.watchdog.enabled:
            self._ncclx_attach_watchdog()
        if self.attaches_watchdog and self.ncclx.straggler.enabled:
            self._ncclx_attach_straggler_detector()

    def _ncclx_attach_watchdog(self) -> None:
        from lightning_ncclx.strategies.callbacks import attach_default_watchdog

        trainer = self._ncclx_trainer()
        if trainer is not None:
            attach_default_watchdog(trainer, self.ncclx, self._ncclx_dump_dir)

    def _ncclx_attach_straggler_detector(self) -> None:
        from lightning_ncclx.strategies.callbacks import attach_default_straggler_detector

        trainer = self._ncclx_trainer()
        if trainer is not None:
            attach_default_straggler_detector(trainer, self.ncclx, self._ncclx_dump_dir)

    # ------------------------------------------------------------------ after the process group
    def _ncclx_after_group(self) -> None:
        if is_nccl_family(self._ncclx_backend) and self._ncclx_backend != "nccl":
            # Lightning registers its atexit destroy only for the exact string "nccl".
            from lightning.fabric.utilities.distributed import _destroy_dist_connection

            atexit.register(_destroy_dist_connection)
        if getattr(self, "global_rank", 0) == 0:
            log.info(self.ncclx_setup_line())
            if self.ncclx.watchdog.enabled and os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip() in ("0", ""):
                log.warning(
                    "%s: the stall watchdog is on but the flight recorder is off (TORCH_FR_BUFFER_SIZE=%r): stall "
                    "dumps will hold stacks and context but no collective trace, and the culprit collective "
                    "cannot be named; set ncclx.flight_recorder.buffer_size > 0",
                    self.strategy_name,
                    os.environ.get("TORCH_FR_BUFFER_SIZE", ""),
                )

    def ncclx_setup_line(self) -> str:
        """One line: asked backend, what serves each device, NCCL version, recorder, dumps, timeouts."""
        from lightning_ncclx.backend.serving import nccl_version, serving_implementations

        serving = ", ".join(f"{dev}: {impl}" for dev, impl in serving_implementations().items()) or "no group"
        timeouts = self.ncclx.timeouts
        buffer = os.environ.get("TORCH_FR_BUFFER_SIZE", "?")
        return (
            f"{self.strategy_name}: backend asked={self.ncclx.backend} -> {self._ncclx_backend}; serving {serving}; "
            f"NCCL {nccl_version() or 'n/a'}; flight recorder {buffer} entries/rank; dumps -> {self._ncclx_dump_dir}; "
            f"timeouts {timeouts.init_timeout_seconds:g} s at start-up, {timeouts.training_timeout_seconds:g} s "
            f"after {timeouts.warmup_steps} batches"
        )

    def _ncclx_barrier(self, device_ids: list[int] | None) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        if is_nccl_family(dist.get_backend()) and device_ids is not None:
            dist.barrier(device_ids=device_ids)
        else:
            dist.barrier()

    def _ncclx_on_train_batch_start(self) -> None:
        schedule = self._ncclx_schedule
        if schedule is None:
            return
        if schedule.should_switch_before_batch():
            schedule.switched = True
            refused = apply_timeout_to_all_groups(schedule.training_timeout, self.barrier)  # type: ignore[attr-defined]
            if getattr(self, "global_rank", 0) == 0:
                log.info(
                    "%s: collective timeout now %g s on every process group%s",
                    self.strategy_name,
                    schedule.training_timeout.total_seconds(),
                    f" (unchanged on {refused})" if refused else "",
                )
        schedule.batch_started()
