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
from lightning_ncclx.dump.location import plugin_named_folders, resolve_dump_dir, torch_dump_prefix
from lightning_ncclx.layout import RUN_ID_VARIABLE
from lightning_ncclx.strategies.arguments import fold_lightning_arguments
from lightning_ncclx.strategies.run_scope import RunScope, exported, next_trainer

from lightning_ncclx.log_setup import ensure_visible_logging

log = logging.getLogger(__name__)
ensure_visible_logging()


def _process_group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class NcclxStrategyMixin:
    """Mixed in before a Lightning strategy class (``class X(NcclxStrategyMixin, DDPStrategy)``).

    Each concrete strategy spells out its Lightning parent's constructor signature (so that
    ``inspect.signature`` and LightningCLI see every argument) and forwards it here by keyword."""

    strategy_name = "ncclx"
    attaches_watchdog = True

    # Set by _ncclx_init; declared for type checkers.
    ncclx: NcclxConfig
    _ncclx_backend: str | None
    _ncclx_passthrough_backend: str | None
    _ncclx_dump_dir: Path | None
    _ncclx_schedule: TimeoutSchedule | None
    _ncclx_run_id: str | None
    _ncclx_trainer_number: int
    _ncclx_scope: RunScope

    def __init__(
        self,
        *args: Any,
        ncclx: NcclxConfig | Mapping[str, Any] | None = None,
        timeout: timedelta | float | None = None,
        process_group_backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._ncclx_init(ncclx, timeout, process_group_backend)
        super().__init__(  # type: ignore[call-arg]
            *args,
            timeout=timedelta(seconds=self.ncclx.timeouts.init_timeout_seconds),
            process_group_backend=process_group_backend,
            **kwargs,
        )

    def _configure_launcher(self) -> None:
        self._ncclx_before_launch()
        super()._configure_launcher()  # type: ignore[misc]
        self._ncclx_hand_run_id_to_children()

    def setup_environment(self) -> None:
        try:
            self._ncclx_prepare_environment()
            super().setup_environment()  # type: ignore[misc]
        except BaseException:
            self._ncclx_scope.close()  # a failed set-up takes back what it set, torn down or not
            raise
        if not _process_group_exists():
            # No group was made (init_process_group mocked or patched out): nothing reads the
            # variables, and a set-up that is never torn down must not leave them behind.
            self._ncclx_scope.close()
            return
        self._ncclx_after_group()

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        trainer = self._ncclx_trainer()
        if trainer is not None:  # not under Fabric: no lightning.pytorch import there
            from lightning_ncclx.strategies.scope_closer import closes_after_callbacks

            if closes_after_callbacks(trainer, self):
                return
        self._ncclx_scope.close()

    def _get_process_group_backend(self) -> str:
        return self._ncclx_backend or self._ncclx_resolve_backend()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]
        self._ncclx_on_train_batch_start()

    def _ncclx_init(
        self,
        ncclx: NcclxConfig | Mapping[str, Any] | None,
        timeout: timedelta | float | None,
        process_group_backend: str | None,
    ) -> None:
        folded = fold_lightning_arguments(type(self).__name__, ncclx_config_from(ncclx), timeout, process_group_backend)
        self.ncclx = folded.ncclx
        self._ncclx_passthrough_backend = folded.passthrough_backend
        self._ncclx_backend = None
        self._ncclx_dump_dir = None
        self._ncclx_schedule = None
        self._ncclx_run_id = None
        self._ncclx_trainer_number = 1
        self._ncclx_scope = RunScope()

    # ----------------------------------------------------------------- before the process group
    @property
    def ncclx_dump_dir(self) -> Path | None:
        """The run's dump folder, known once ``setup_environment`` has run."""
        return self._ncclx_dump_dir

    @property
    def ncclx_run_id(self) -> str | None:
        """This Trainer's run id (the same on every rank), known once the launcher is configured."""
        return self._ncclx_run_id

    def _ncclx_resolve_backend(self, caps: BackendCapabilities | None = None) -> str:
        if self._ncclx_passthrough_backend is not None:
            return self._ncclx_passthrough_backend  # a name torch may know: torch judges it, as with Lightning
        device_type = self.root_device.type  # type: ignore[attr-defined]
        return resolve_backend(self.ncclx.backend, device_type, caps or probe_capabilities())

    def _ncclx_before_launch(self) -> None:
        """In the launching process: refuse an unservable backend before any child starts, and
        give this Trainer its run id."""
        self._ncclx_backend = self._ncclx_resolve_backend()
        configured = self.ncclx.flight_recorder.dump_dir
        if configured is not None:
            probe = RunScope()
            try:
                probe.make_writable_folder(resolve_dump_dir(configured, None), "ncclx.flight_recorder.dump_dir")
            finally:
                probe.close()  # each rank makes it again in setup_environment
        self._ncclx_run_id, self._ncclx_trainer_number = next_trainer()

    def _ncclx_hand_run_id_to_children(self) -> None:
        """Script launchers (``ddp``/popen) start children that re-run the script: they read this
        Trainer's run id from their environment, set only while they are started."""
        launcher = getattr(self, "_launcher", None)
        start_children = getattr(launcher, "_call_children_scripts", None)
        if start_children is None or self._ncclx_run_id is None:
            return
        run_id = self._ncclx_run_id

        def start_children_with_run_id() -> None:
            with exported({RUN_ID_VARIABLE: run_id}):
                start_children()

        launcher._call_children_scripts = start_children_with_run_id  # type: ignore[union-attr]

    def _ncclx_trainer(self) -> Any:
        """The Trainer driving this strategy (None under Fabric or before connect)."""
        module = getattr(self, "lightning_module", None)
        trainer = getattr(module, "_trainer", None) if module is not None else None
        # Only a Trainer-like object: strategies are also driven by hand with stand-in modules.
        return trainer if isinstance(getattr(trainer, "callbacks", None), list) else None

    def _ncclx_prepare_environment(self) -> None:
        self._ncclx_backend = self._ncclx_resolve_backend()
        self._process_group_backend = self._ncclx_backend  # type: ignore[attr-defined]
        if self._ncclx_run_id is None:  # set up without a launcher (Fabric's or a test's own calls)
            self._ncclx_run_id, self._ncclx_trainer_number = next_trainer()
        recorder = self.ncclx.flight_recorder
        root = getattr(self._ncclx_trainer(), "default_root_dir", None)
        dump_dir = resolve_dump_dir(recorder.dump_dir, root, self._ncclx_run_id, self._ncclx_trainer_number)
        prefix = torch_dump_prefix(dump_dir, recorder.torch_dump_prefix)
        # torch writes its own timeout dumps there without creating folders; teardown removes
        # whatever stayed empty.
        self._ncclx_scope.make_writable_folder(prefix.parent, "ncclx.flight_recorder.dump_dir")
        # Ranks on one host share these; whichever closes last finds them empty.
        self._ncclx_scope.remove_when_empty(plugin_named_folders(dump_dir, recorder.dump_dir is not None))
        self._ncclx_dump_dir = dump_dir
        environ = dict(os.environ)
        to_set, _ = apply_recorder_env(recorder, prefix, environ)
        self._ncclx_scope.export(to_set)
        self._ncclx_recorder_buffer = environ.get("TORCH_FR_BUFFER_SIZE", "")  # what torch will read, once
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
        trainer = self._ncclx_trainer()
        if trainer is not None:
            from lightning_ncclx.strategies.scope_closer import attach_closer

            attach_closer(trainer, self)  # last: it closes the scope once the watchdog (and others) stopped

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
            buffer = getattr(self, "_ncclx_recorder_buffer", "")
            if self.ncclx.watchdog.enabled and buffer.strip() in ("0", ""):
                log.warning(
                    "%s: the stall watchdog is on but the flight recorder is off (TORCH_FR_BUFFER_SIZE=%r): stall "
                    "dumps will hold stacks and context but no collective trace, and the culprit collective "
                    "cannot be named; set ncclx.flight_recorder.buffer_size > 0",
                    self.strategy_name,
                    buffer,
                )

    def ncclx_setup_line(self) -> str:
        """One line: asked backend, what serves each device, NCCL version, recorder, dumps, timeouts."""
        from lightning_ncclx.backend.serving import serving_implementations
        from lightning_ncclx.backend.torch_api import nccl_version

        serving = ", ".join(f"{dev}: {impl}" for dev, impl in serving_implementations().items()) or "no group"
        timeouts = self.ncclx.timeouts
        buffer = getattr(self, "_ncclx_recorder_buffer", "") or "?"
        return (
            f"{self.strategy_name}: backend asked={self._ncclx_passthrough_backend or self.ncclx.backend} -> "
            f"{self._ncclx_backend}; serving {serving}; "
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
