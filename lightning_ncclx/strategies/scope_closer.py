"""Take a run's variables and empty folders back after the callbacks' teardown, not before.

Lightning tears the strategy down before the callbacks' ``teardown`` hooks, and the stall watchdog
(a callback) keeps running, and may still dump, until its own teardown. So on a normal end the
strategy leaves its :class:`RunScope` open and this callback, last in the list, closes it. After an
exception Lightning runs no callback teardown: the strategy then closes the scope itself.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback


class RunScopeCloser(Callback):
    """Closes ``strategy``'s run scope in ``teardown``; added by the ncclx strategies."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.strategy._ncclx_scope.close()


def attach_closer(trainer: Any, strategy: Any) -> None:
    """Append a closer for ``strategy`` to ``trainer.callbacks`` (once)."""
    if not any(isinstance(c, RunScopeCloser) and c.strategy is strategy for c in trainer.callbacks):
        trainer.callbacks.append(RunScopeCloser(strategy))


def closes_after_callbacks(trainer: Any, strategy: Any) -> bool:
    """Whether a closer will run after this strategy teardown: a normal end (the Trainer still
    RUNNING) with a closer attached. After an exception the status is INTERRUPTED."""
    if trainer is None:
        return False
    status = getattr(getattr(trainer, "state", None), "status", None)
    attached = any(isinstance(c, RunScopeCloser) and c.strategy is strategy for c in trainer.callbacks)
    return attached and getattr(status, "value", status) == "running"
