"""``strategies/arguments.py``: folding Lightning's ``timeout=`` and ``process_group_backend=``
into ``ncclx``, called directly - which values are accepted, which stall thresholds are lowered
(defaults only, to half the timeout phase each one races), the ``auto`` floor, a disabled
watchdog, and the error messages that name the owner.

Through the strategies' constructors the main cases are in
``tests/strategies/test_lightning_arguments.py``."""

from __future__ import annotations

import logging
import re
from datetime import timedelta

import pytest

from lightning_ncclx.config import NcclxConfig, ncclx_config_from
from lightning_ncclx.errors import ConfigError
from lightning_ncclx.strategies.arguments import FoldedArguments, fold_lightning_arguments


def fold(timeout=None, backend=None, ncclx: dict | None = None) -> FoldedArguments:
    return fold_lightning_arguments("Owner", ncclx_config_from(ncclx), timeout, backend)


def thresholds(config: NcclxConfig) -> tuple[float, float, float, float]:
    w = config.watchdog
    return w.first_step_seconds, w.train_step_seconds, w.validation_seconds, w.checkpoint_seconds


def test_nothing_given_is_the_config_itself() -> None:
    config = NcclxConfig()
    folded = fold_lightning_arguments("Owner", config, None, None)
    assert folded.ncclx is config and folded.passthrough_backend is None


@pytest.mark.parametrize("timeout", [timedelta(minutes=15), 900, 900.0])
def test_a_timeout_is_a_timedelta_or_seconds(timeout) -> None:
    timeouts = fold(timeout).ncclx.timeouts
    assert (timeouts.init_timeout_seconds, timeouts.training_timeout_seconds) == (900.0, 600.0)


@pytest.mark.parametrize("timeout", [True, "900", [900]])
def test_anything_else_is_refused_naming_the_owner(timeout) -> None:
    message = f"Owner(timeout={timeout!r}) is not valid: expected a datetime.timedelta or seconds"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        fold(timeout)


def test_only_the_thresholds_that_would_not_fire_before_their_timeout_are_lowered() -> None:
    # 900 s: start-up 900 (first step 900 races it), training min(600, 900) = 600 (all others are shorter)
    assert thresholds(fold(900).ncclx) == (450.0, 300.0, 500.0, 500.0)
    # 500 s: training 500, so validation and checkpoint (500) race it too; the step (300) does not
    assert thresholds(fold(500).ncclx) == (250.0, 300.0, 250.0, 250.0)
    # 100 s: every default races
    assert thresholds(fold(100).ncclx) == (50.0, 50.0, 50.0, 50.0)


def test_a_long_timeout_changes_no_threshold() -> None:
    folded = fold(timedelta(hours=1))
    assert folded.ncclx.timeouts.init_timeout_seconds == 3600.0
    assert thresholds(folded.ncclx) == thresholds(NcclxConfig())


def test_the_auto_floor_follows_a_lowered_step_threshold_and_is_otherwise_kept() -> None:
    assert fold(40).ncclx.watchdog.auto.floor_seconds == 20.0  # step threshold 20 s < default floor 30 s
    assert fold(100).ncclx.watchdog.auto.floor_seconds == 30.0  # step threshold 50 s: the floor fits
    off = fold(40, ncclx={"watchdog": {"auto": {"enabled": False}}}).ncclx.watchdog
    assert off.auto.floor_seconds == 30.0 and off.train_step_seconds == 20.0


def test_a_disabled_watchdog_is_left_as_it_is() -> None:
    folded = fold(100, ncclx={"watchdog": {"enabled": False}}).ncclx
    assert thresholds(folded) == thresholds(NcclxConfig())
    assert folded.timeouts.training_timeout_seconds == 100.0


def test_a_threshold_the_user_set_below_the_timeout_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lightning_ncclx.strategies.arguments"):
        folded = fold(100, ncclx={"watchdog": {"train_step_seconds": 45, "auto": {"floor_seconds": 10}}}).ncclx
    assert thresholds(folded) == (50.0, 45.0, 50.0, 50.0)
    assert [r.getMessage() for r in caplog.records] == [
        "Owner: timeout=100 s: stall thresholds lowered to half the timeout they race (ncclx.watchdog.first_step_seconds=50, "
        "ncclx.watchdog.validation_seconds=50, ncclx.watchdog.checkpoint_seconds=50)"]


def test_a_shorter_training_timeout_is_kept_under_a_longer_lightning_timeout() -> None:
    folded = fold(1000, ncclx={"timeouts": {"training_timeout_seconds": 550}}).ncclx
    assert (folded.timeouts.init_timeout_seconds, folded.timeouts.training_timeout_seconds) == (1000.0, 550.0)
    assert thresholds(folded) == thresholds(NcclxConfig())  # 900 < 1000; 300, 500, 500 < 550


def test_a_start_up_timeout_set_in_ncclx_must_equal_the_lightning_one() -> None:
    assert fold(1200, ncclx={"timeouts": {"init_timeout_seconds": 1200}}).ncclx.timeouts.init_timeout_seconds == 1200.0
    with pytest.raises(ConfigError, match=r"^Owner\(timeout=90.5 s\) disagrees with ncclx.timeouts.init_timeout_seconds=1200: set one of them$"):
        fold(90.5, ncclx={"timeouts": {"init_timeout_seconds": 1200}})


def test_a_non_positive_timeout_is_refused_by_the_config_checks() -> None:
    with pytest.raises(ConfigError, match=r"ncclx.timeouts.init_timeout_seconds=0.0 is not valid"):
        fold(0)


@pytest.mark.parametrize(("backend", "ncclx_backend", "folded", "passthrough"), [
    (None, "gloo", "gloo", None),
    ("auto", "gloo", "gloo", None),  # "auto" never overrides a configured backend
    ("gloo", "gloo", "gloo", None),  # the same choice twice agrees
    ("nccl-lazy", "auto", "nccl-lazy", None),
    ("nccl-legacy", "auto", "nccl-legacy", None),
    ("ucc", "auto", "auto", "ucc"),
])
def test_process_group_backend(backend, ncclx_backend: str, folded: str, passthrough) -> None:
    result = fold(backend=backend, ncclx={"backend": ncclx_backend})
    assert (result.ncclx.backend, result.passthrough_backend) == (folded, passthrough)


def test_a_passthrough_backend_cannot_override_a_configured_one() -> None:
    with pytest.raises(ConfigError, match=r"^Owner\(process_group_backend='mpi'\) disagrees with ncclx.backend='gloo': set one of them$"):
        fold(backend="mpi", ncclx={"backend": "gloo"})


def test_backend_and_timeout_fold_together() -> None:
    result = fold(timedelta(seconds=60), "gloo")
    assert result.ncclx.backend == "gloo" and result.passthrough_backend is None
    assert result.ncclx.timeouts.init_timeout_seconds == 60.0 and thresholds(result.ncclx) == (30.0, 30.0, 30.0, 30.0)
