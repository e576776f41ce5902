"""``strategies/scope_closer.py``: the callback that takes a run's variables and empty folders
back after every other callback's ``teardown``, attached once per strategy, and the rule the
strategy's own teardown follows (leave the closing to the callback only on a normal end, when
the Trainer is still RUNNING). Real Lightning Trainer and ncclx strategy, no processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.states import TrainerStatus

from lightning_ncclx.strategies import DDPNcclxStrategy
from lightning_ncclx.strategies.scope_closer import RunScopeCloser, attach_closer, closes_after_callbacks

VARIABLE = "LIGHTNING_NCCLX_TEST_SCOPE_VARIABLE"


def trainer(*callbacks: Callback) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                   enable_model_summary=False, callbacks=list(callbacks))


def closers(t: Trainer) -> list[RunScopeCloser]:
    return [c for c in t.callbacks if isinstance(c, RunScopeCloser)]


def test_one_closer_per_strategy_appended_last() -> None:
    t = trainer()
    first, second = DDPNcclxStrategy(), DDPNcclxStrategy()
    attach_closer(t, first)
    attach_closer(t, first)
    attach_closer(t, second)
    assert [c.strategy for c in closers(t)] == [first, second]
    assert t.callbacks[-2:] == closers(t)


@pytest.mark.parametrize(("status", "expected"), [(TrainerStatus.RUNNING, True), (TrainerStatus.INTERRUPTED, False),
                                                  (TrainerStatus.FINISHED, False), (TrainerStatus.INITIALIZING, False)])
def test_the_closer_runs_after_callbacks_only_on_a_normal_end(status: TrainerStatus, expected: bool) -> None:
    t, strategy = trainer(), DDPNcclxStrategy()
    attach_closer(t, strategy)
    t.state.status = status
    assert closes_after_callbacks(t, strategy) is expected


def test_without_a_trainer_or_without_this_strategys_closer_the_strategy_closes_itself() -> None:
    t, strategy = trainer(), DDPNcclxStrategy()
    t.state.status = TrainerStatus.RUNNING
    assert closes_after_callbacks(None, strategy) is False
    assert closes_after_callbacks(t, strategy) is False
    attach_closer(t, DDPNcclxStrategy())  # another strategy's closer does not close this one's scope
    assert closes_after_callbacks(t, strategy) is False


def test_teardown_restores_variables_and_removes_empty_folders_after_the_other_callbacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, "before")
    seen: list[str | None] = []

    class Watchdog(Callback):  # stands for the stall watchdog: still running when teardown starts
        def teardown(self, trainer, pl_module, stage):
            seen.append(os.environ.get(VARIABLE))

    strategy = DDPNcclxStrategy()
    strategy._ncclx_scope.export({VARIABLE: "during-run"})
    strategy._ncclx_scope.make_writable_folder(tmp_path / "ncclx_dumps" / "run-1", "ncclx.flight_recorder.dump_dir")
    t = trainer(Watchdog())
    attach_closer(t, strategy)
    call._call_callback_hooks(t, "teardown", stage="fit")
    assert seen == ["during-run"]  # the watchdog still saw the run's variables
    assert os.environ[VARIABLE] == "before"
    assert not (tmp_path / "ncclx_dumps").exists()
