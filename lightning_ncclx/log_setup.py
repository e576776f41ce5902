"""The ``lightning_ncclx`` logger, set up the way Lightning sets up ``lightning.pytorch``.

A hang summary nobody sees is worthless: when the application has configured no logging (the
root logger has no handler), the plugin's INFO lines get a stderr handler, exactly as Lightning does
for its own logger. When the root logger has handlers (Hydra, user set-up), they only propagate.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

PACKAGE_LOGGER = "lightning_ncclx"


def ensure_visible_logging() -> logging.Logger:
    logger = logging.getLogger(PACKAGE_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not logger.handlers:
        logger.addHandler(logging.StreamHandler())
        logger.propagate = False
    return logger


class RepeatedFailure:
    """A failure that repeats at every poll (a store that is gone): the first is logged with its
    traceback, then the 10th, 100th and every 1000th in a row as one counted line. Only
    ``RESET_AFTER_SECONDS`` of successes start the count again: a step that fails whenever it
    talks to the store and succeeds in between (it had nothing to read) is one run of failures.
    Nothing is swallowed silently, nothing floods the log."""

    RESET_AFTER_SECONDS = 30.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.in_a_row = 0
        self._clock = clock
        self._good_since: float | None = None

    def failed(self, logger: logging.Logger, message: str, *args: object) -> None:
        good_since, self._good_since = self._good_since, None
        if good_since is not None and self._clock() - good_since >= self.RESET_AFTER_SECONDS:
            self.in_a_row = 0
        self.in_a_row += 1
        n = self.in_a_row
        if n == 1:
            logger.warning(message, *args, exc_info=True)
        elif n in (10, 100) or n % 1000 == 0:
            logger.warning(message + " (%d times in a row; the first is logged with its traceback)", *args, n)

    def succeeded(self) -> None:
        if self._good_since is None:
            self._good_since = self._clock()
