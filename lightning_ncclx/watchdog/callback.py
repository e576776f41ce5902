"""``StallWatchdog``: the Lightning callback that feeds the per-rank watchdog with heartbeats.

Example::

    from lightning.pytorch import Trainer
    from lightning_ncclx.config import WatchdogConfig
    from lightning_ncclx.watchdog import StallWatchdog

    trainer = Trainer(strategy="ddp", callbacks=[StallWatchdog(WatchdogConfig(train_step_seconds=120.0))])

The hooks only write a timestamp (no collective, no store round trip per step). The thread,
the store client and the signal handler are created in ``setup``, so the callback pickles for
``ddp_spawn``.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_ncclx.config import AlertsConfig, FlightRecorderConfig, WatchdogConfig, exit_code_for
from lightning_ncclx.dump.location import resolve_dump_dir
from lightning_ncclx.dump.p2p_ops import TRACKER as P2P_TRACKER
from lightning_ncclx.dump.writer import cuda_index
from lightning_ncclx.watchdog.deferred_signals import signals_held
from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase
from lightning_ncclx.watchdog.loop_phases import LoopPhases
from lightning_ncclx.watchdog.runtime import WatchdogRuntime

log = logging.getLogger(__name__)


def _forget_in_lightnings_saved_handlers(trainer: Any, handler: Any) -> None:
    """After ``on_exception`` Lightning's trainer puts back the signal handlers it saw when the
    loop started (after ``setup``, so the watchdog's among them), but calls no ``teardown`` hook:
    the handler just given back would come back for the rest of the process. Where Lightning's
    table still holds it, it takes what stands now instead."""
    saved = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None)
    if not isinstance(saved, dict):
        return
    for number, held in list(saved.items()):
        if held is handler:
            try:
                saved[number] = signal.getsignal(number)
            except (ValueError, TypeError):
                log.debug("could not read the handler of signal %s", number, exc_info=True)


def _global_step(trainer: Any) -> int | None:
    try:
        return int(trainer.global_step)
    except Exception:  # noqa: BLE001
        return None


def _stragglers_writer(trainer: Any) -> Any:
    """The ``write_stragglers_json`` of this Trainer's straggler detector, if it has one: the
    stall event's folder then holds the straggler scores too."""
    for callback in list(getattr(trainer, "callbacks", None) or []):
        writer = getattr(callback, "write_stragglers_json", None)
        if callable(writer):
            return writer
    return None


class StallWatchdog(Callback):
    """Notices a stalled step on any rank, dumps every rank and writes one summary.

    Args:
        config: thresholds, poll interval, on_stall action (default ``WatchdogConfig()``).
        dump_dir: the run's dump folder; default ``resolve_dump_dir(flight_recorder.dump_dir,
            trainer.default_root_dir)``, resolved in ``setup``.
        flight_recorder: read for ``dump_dir`` and ``stack_traces``.
        alerts: where the rank that summarizes a confirmed hang sends its alert (default: none).
    """

    def __init__(self, config: WatchdogConfig | None = None, *, dump_dir: str | os.PathLike[str] | None = None,
                 flight_recorder: FlightRecorderConfig | None = None, alerts: AlertsConfig | None = None) -> None:
        self.config = config if config is not None else WatchdogConfig()
        self.alerts = alerts
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.flight_recorder = flight_recorder if flight_recorder is not None else FlightRecorderConfig()
        self._runtime: WatchdogRuntime | None = None
        self._loop_phases: LoopPhases | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runtime"] = None  # threads, locks and store clients never cross a pickle
        state["_loop_phases"] = None
        return state

    @property
    def runtime(self) -> WatchdogRuntime | None:
        """The running watchdog of this process (None outside fit/validate or when disabled)."""
        return self._runtime

    def resolved_dump_dir(self, trainer: Any) -> Path:
        if self.dump_dir is not None:
            return self.dump_dir.absolute()
        return resolve_dump_dir(self.flight_recorder.dump_dir, getattr(trainer, "default_root_dir", None))

    # ------------------------------------------------------------------------------ life cycle
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.config.enabled or self._runtime is not None:
            return
        try:
            runtime = WatchdogRuntime(self.config, self.resolved_dump_dir(trainer),
                                      stack_traces=self.flight_recorder.stack_traces,
                                      alerts=getattr(self, "alerts", None))
            runtime.on_dumped = lambda reason: self._record_event(trainer, runtime, reason)
            runtime.cuda_device = cuda_index(getattr(getattr(trainer, "strategy", None), "root_device", None))
            runtime.on_summarized = lambda event, kind, advice: self._record_kind(trainer, event, kind, advice,
                                                                                    self.config)
            runtime.stragglers_writer = _stragglers_writer(trainer)
            runtime.start()
            self._runtime = runtime
            self._loop_phases = LoopPhases(self._heartbeat)
            self._loop_phases.attach(trainer)
            P2P_TRACKER.attach()  # the groups made later (configure_model, a module's setup): at batch starts
        except Exception:  # noqa: BLE001 - a watchdog that cannot start must not stop training
            log.warning("the stall watchdog could not start; training continues without it", exc_info=True)

    def _heartbeat(self) -> Heartbeat | None:
        return self._runtime.heartbeat if self._runtime is not None else None

    def _stop(self, *, unhook: bool = True) -> None:
        """``unhook``: remove the p2p hooks from the process groups (the main thread between
        steps); after an exception another thread may still be inside an op: they only go quiet."""
        if self._runtime is not None:
            if unhook:
                P2P_TRACKER.detach()
            else:
                P2P_TRACKER.active = False
        loop_phases, self._loop_phases = self._loop_phases, None
        if loop_phases is not None:
            loop_phases.detach()
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            try:
                runtime.stop()
            except Exception:  # noqa: BLE001
                log.warning("stopping the stall watchdog failed", exc_info=True)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        runtime = self._runtime
        self._stop()
        if runtime is not None:
            try:
                runtime.guard_exit()
            except Exception:  # noqa: BLE001
                log.warning("the exit guard could not be set", exc_info=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        runtime = self._runtime
        if runtime is not None:
            runtime.heartbeat.beat(Phase.idle)
            with signals_held():
                runtime.on_exception(exception)
        self._stop(unhook=False)
        if runtime is None:
            self._exit_like_the_ranks(exception)
        else:
            _forget_in_lightnings_saved_handlers(trainer, runtime.signal_handler)

    def _exit_like_the_ranks(self, exception: BaseException) -> None:
        """In the launching process of ``ddp_spawn`` (no rank runs here): when the ranks left with
        the watchdog's exit status, this process exits with it too, as the popen launcher's
        does, instead of raising ``ProcessExitedException`` (which Python reports as 1)."""
        code = getattr(exception, "exit_code", None)
        ours = {self.config.exit_code, *self.config.exit_codes.values()}
        if type(exception).__name__ != "ProcessExitedException" or code not in ours:
            return
        log.error("the ranks ended with the stall watchdog's exit status %d (%s); exiting with it", code, exception)
        raise SystemExit(code) from exception

    # ------------------------------------------------------------------------------ heartbeats
    def _beat(self, phase: Phase, trainer: Any) -> None:
        runtime = self._runtime
        if runtime is not None:
            runtime.heartbeat.beat(phase, _global_step(trainer))

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        if self._runtime is not None:
            self._runtime.heartbeat.sanity_check(True)

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        if self._runtime is not None:
            self._runtime.heartbeat.sanity_check(False)

    def _keep_signal_armed(self) -> None:
        if self._runtime is not None:
            self._runtime.keep_signal_armed()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._runtime is not None:
            P2P_TRACKER.attach()
            self._runtime.keep_signal_armed()  # after process-group set-up and the first collectives
        self._beat(Phase.setup if self._batches() == 0 else Phase.train_step, trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning creates a later epoch's loader iterator (workers start, first batch is
        # prefetched) after this hook: a step threshold would flag a slow loader start.
        self._beat(Phase.setup if self._batches() == 0 else Phase.epoch_start, trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._runtime is not None:
            self._runtime.heartbeat.train_batch_start(_global_step(trainer))
            P2P_TRACKER.attach()  # a length check unless a process group was made since

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        runtime = self._runtime
        if runtime is not None:
            runtime.heartbeat.train_batch_end(_global_step(trainer))
            runtime.keep_signal_armed()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # Epoch-end work (metric syncs, EarlyStopping, checkpoint callbacks) runs collectives that
        # can hang too: watch it with the validation threshold until the next epoch or fit's end.
        self._beat(Phase.validation, trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._beat(Phase.teardown, trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._beat(Phase.teardown, trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._beat(Phase.validation, trainer)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._beat(Phase.validation, trainer)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._beat(Phase.validation, trainer)
        self._keep_signal_armed()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        # Inside fit the phase stays validation after the loop's end hooks (the module's
        # on_validation_end, a checkpoint callback's upload) until the next batch or epoch start.
        runtime = self._runtime
        if runtime is None or getattr(trainer, "sanity_checking", False):
            return
        if not (bool(getattr(trainer, "training", False)) or getattr(trainer.state, "fn", None) == "fit"):
            self._beat(Phase.teardown, trainer)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._beat(Phase.validation, trainer)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._beat(Phase.validation, trainer)
        self._keep_signal_armed()

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._beat(Phase.teardown, trainer)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        self._beat(Phase.validation, trainer)

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        self._beat(Phase.validation, trainer)
        self._keep_signal_armed()

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._beat(Phase.teardown, trainer)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # Inside save_checkpoint already; this also covers a Trainer whose method was not wrapped.
        runtime = self._runtime
        if runtime is not None and runtime.heartbeat.last.phase is not Phase.checkpoint:
            self._beat(Phase.checkpoint, trainer)

    # ------------------------------------------------------------------------------ helpers
    def _batches(self) -> int:
        return self._runtime.heartbeat.batches if self._runtime is not None else 0

    @staticmethod
    def _record_kind(trainer: Any, event: str, kind: str, advice: dict, config: WatchdogConfig) -> None:
        """Watchdog thread, once the kind is known (the summarizing rank, or any rank told it on
        the way out): the kind as a metric ``ncclx/hang_kind/<kind>`` (loggers take numbers) and
        the exit status ``dump_and_exit`` maps it to. Loggers write on rank 0 only."""
        metrics = {f"ncclx/hang_kind/{kind}": 1.0, "ncclx/hang_exit_code": float(exit_code_for(kind, config))}
        log.warning("%s: hang kind %s; restart advice %s%s", event, kind, advice.get("action", "?"),
                    f" excluding {','.join(advice['hosts_to_exclude'])}" if advice.get("hosts_to_exclude") else "")
        for logger in list(getattr(trainer, "loggers", []) or []):
            try:
                logger.log_metrics(metrics, step=_global_step(trainer))
                logger.save()
            except Exception:  # noqa: BLE001
                log.warning("recording the hang kind in %s failed", type(logger).__name__, exc_info=True)

    @staticmethod
    def _record_event(trainer: Any, runtime: WatchdogRuntime, reason: str) -> None:
        """Watchdog thread, after this rank dumped: record the event in the Trainer's loggers.

        It cannot wait for the main thread, which is stuck in a stall. Loggers write on global
        rank 0 only, which takes part in every event it is alive for. After a stall or an
        exception the main thread is not using the loggers, so they are saved too."""
        metrics = {"ncclx/dump_events": float(runtime.events_taken_part), "ncclx/stall_events": float(runtime.stall_events)}
        for logger in list(getattr(trainer, "loggers", []) or []):
            try:
                logger.log_metrics(metrics, step=_global_step(trainer))
                if reason in ("stall", "exception"):
                    logger.save()
            except Exception:  # noqa: BLE001 - a logger that fails here must not end the dump
                log.warning("recording the dump event in %s failed", type(logger).__name__, exc_info=True)
