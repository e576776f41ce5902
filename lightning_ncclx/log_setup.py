"""The ``lightning_ncclx`` logger, set up the way Lightning sets up ``lightning.pytorch``.

A hang summary nobody sees is worthless: when the application has configured no logging (the
root logger has no handler), the plugin's INFO lines get a stderr handler, exactly as Lightning does
for its own logger. When the root logger has handlers (Hydra, user set-up), they only propagate.
"""

from __future__ import annotations

import logging

PACKAGE_LOGGER = "lightning_ncclx"


def ensure_visible_logging() -> logging.Logger:
    logger = logging.getLogger(PACKAGE_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not logger.handlers:
        logger.addHandler(logging.StreamHandler())
        logger.propagate = False
    return logger
