"""Phase changes at Lightning's loop level, before any hook of the user or the module runs.

Lightning calls the callbacks' hooks in list order (``ModelCheckpoint`` moved last), then the
LightningModule's, and some module hooks and the loaders' set-up come before any callback hook.
So a phase that ``StallWatchdog`` set from its own hooks would reach the user's hooks late or not
at all: an upload in a user's ``on_train_epoch_end`` would run in ``train_step``. The phase is set
instead where the loops start the work, whatever the callback order:

- ``Trainer.save_checkpoint`` (however it is called): ``checkpoint``, then back to the phase before;
- the fit loop's epoch end (``on_advance_end``: every ``on_train_epoch_end``, epoch-end metric
  syncs, schedulers): ``validation``, until the next training batch or epoch starts;
- the fit loop's epoch start (``on_advance_start``: loader set-up, ``on_train_epoch_start``):
  ``epoch_start`` (``setup`` before the first batch);
- every evaluation loop's run (validation inside fit, sanity check, validate, test, predict):
  ``validation`` from its loader's set-up on; inside fit it stays ``validation`` after the run's
  end hooks, until the next training batch or epoch starts.

Each wrapper is an attribute of that Trainer's own objects (the classes are untouched), removed
when the watchdog stops; a loop Lightning no longer has is skipped (the callback's hooks still
set the phases, later).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase

log = logging.getLogger(__name__)

MARK = "_ncclx_watched"


def _global_step(trainer: Any) -> int | None:
    try:
        return int(trainer.global_step)
    except Exception:  # noqa: BLE001
        return None


class LoopPhases:
    """Wraps one Trainer's loops and ``save_checkpoint`` so they beat the heartbeat first."""

    def __init__(self, heartbeat: Callable[[], Heartbeat | None]) -> None:
        self._heartbeat = heartbeat
        """The running watchdog's heartbeat, or None once it stopped (the wrappers then only call
        through)."""
        self._wrapped: list[tuple[Any, str]] = []

    def attach(self, trainer: Any) -> None:
        fit = getattr(trainer, "fit_loop", None)
        epoch_loop = getattr(fit, "epoch_loop", None)
        self._wrap(fit, "on_advance_start", lambda: self._beat(trainer, None))
        self._wrap(fit, "on_advance_end", lambda: self._beat(trainer, Phase.validation))
        for loop in (getattr(epoch_loop, "val_loop", None), getattr(trainer, "validate_loop", None),
                     getattr(trainer, "test_loop", None), getattr(trainer, "predict_loop", None)):
            self._wrap(loop, "run", lambda: self._beat(trainer, Phase.validation))
        self._wrap_save(trainer)

    def detach(self) -> None:
        wrapped, self._wrapped = self._wrapped, []
        for obj, name in wrapped:
            if getattr(vars(obj).get(name), MARK, False):
                delattr(obj, name)  # the class's method again

    def _beat(self, trainer: Any, phase: Phase | None) -> None:
        heartbeat = self._heartbeat()
        if heartbeat is None:
            return
        if phase is None:  # an epoch starts: its loader restarts before its first batch
            phase = Phase.setup if heartbeat.batches == 0 else Phase.epoch_start
        heartbeat.beat(phase, _global_step(trainer))

    def _wrap(self, obj: Any, name: str, before: Callable[[], None]) -> None:
        original = getattr(obj, name, None) if obj is not None else None
        if original is None or not callable(original) or getattr(original, MARK, False):
            if obj is not None and original is None:
                log.debug("%s has no %s: its phase follows the callback's hooks", type(obj).__name__, name)
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                before()
            except Exception:  # noqa: BLE001 - a heartbeat must never stop the loop
                log.warning("setting the watchdog's phase failed", exc_info=True)
            return original(*args, **kwargs)

        setattr(wrapper, MARK, True)
        setattr(obj, name, wrapper)
        self._wrapped.append((obj, name))

    def _wrap_save(self, trainer: Any) -> None:
        """The checkpoint phase covers building the state dicts (FSDP gathers, which run before
        any hook and without ``on_save_checkpoint`` under ``save_weights_only``), writing and the
        closing barrier; the phase before it resumes with a fresh heartbeat."""
        original = getattr(trainer, "save_checkpoint", None)
        if original is None or getattr(original, MARK, False):
            return

        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            heartbeat = self._heartbeat()
            if heartbeat is None:
                return original(*args, **kwargs)
            before = heartbeat.last.phase
            heartbeat.beat(Phase.checkpoint, _global_step(trainer))
            try:
                return original(*args, **kwargs)
            finally:
                heartbeat.beat(before, _global_step(trainer))

        setattr(save_checkpoint, MARK, True)
        trainer.save_checkpoint = save_checkpoint
        self._wrapped.append((trainer, "save_checkpoint"))
