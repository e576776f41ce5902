"""A failure that repeats at every poll is logged, counted, and does not flood the log."""

from __future__ import annotations

import logging

import pytest

from lightning_ncclx.log_setup import RepeatedFailure

log = logging.getLogger("lightning_ncclx.tests.repeated")


def _fail(failures: RepeatedFailure, times: int) -> None:
    for _ in range(times):
        try:
            raise ConnectionError("the store is gone")
        except ConnectionError:
            failures.failed(log, "[rank %d] reading %s failed", 1, "stall-001")


def test_the_first_failure_has_its_traceback_and_later_ones_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    failures = RepeatedFailure()
    with caplog.at_level(logging.WARNING, logger=log.name):
        _fail(failures, 120)
    records = [r for r in caplog.records if r.name == log.name]
    assert [r.getMessage() for r in records] == [
        "[rank 1] reading stall-001 failed",
        "[rank 1] reading stall-001 failed (10 times in a row; the first is logged with its traceback)",
        "[rank 1] reading stall-001 failed (100 times in a row; the first is logged with its traceback)"]
    assert records[0].exc_info is not None and "ConnectionError: the store is gone" in caplog.text
    assert all(r.exc_info is None for r in records[1:])


def test_successes_that_last_start_the_count_again(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    failures = RepeatedFailure(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=log.name):
        _fail(failures, 3)
        failures.succeeded()
        now[0] += RepeatedFailure.RESET_AFTER_SECONDS
        failures.succeeded()
        _fail(failures, 1)
    records = [r for r in caplog.records if r.name == log.name]
    assert len(records) == 2 and all(r.exc_info is not None for r in records)


def test_a_success_between_failures_is_no_new_start(caplog: pytest.LogCaptureFixture) -> None:
    """A step that fails whenever it reads the store and succeeds when it had nothing to read (a
    store that is gone, seen at every other poll) logs one traceback, not one per failure."""
    now = [0.0]
    failures = RepeatedFailure(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(12):
            _fail(failures, 1)
            now[0] += 1.0
            failures.succeeded()
            now[0] += 1.0
    records = [r for r in caplog.records if r.name == log.name]
    assert [r.exc_info is not None for r in records] == [True, False], [r.getMessage() for r in records]
