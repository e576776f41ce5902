"""The callback the zero-code entry points hand to Lightning (see ``zero_code``)."""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_ncclx.config import NcclxConfig

log = logging.getLogger(__name__)


class EnvironmentAdoption(Callback):
    """Adds the stall watchdog and/or straggler detection in ``setup``, unless the job has them.

    Added callbacks still receive this ``setup``: Lightning iterates the live callback list."""

    def __init__(self, features: tuple[str, ...], config: NcclxConfig | None = None) -> None:
        self.features = tuple(features)
        self.config = config if config is not None else NcclxConfig()

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from lightning_ncclx.strategies.callbacks import attach_default_straggler_detector, attach_default_watchdog

        config = self.config
        added = []
        if "watchdog" in self.features:
            added.append(attach_default_watchdog(trainer, config, None))
        if "straggler" in self.features:
            added.append(attach_default_straggler_detector(trainer, config, None))
        if getattr(trainer, "global_rank", 0) == 0 and stage == "fit":
            log.info("LIGHTNING_NCCLX_WATCH: %s in this job", ", ".join(type(c).__name__ for c in added))
