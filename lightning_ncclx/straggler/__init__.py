"""Live straggler detection: name the slow rank, its host and the slow part of its step while
training runs. ``StragglerDetector`` is the Lightning callback (attached by the ncclx strategies);
``write_stragglers_json`` writes what it knows into a folder (the watchdog's stall event)."""

from __future__ import annotations

from typing import Any

__all__ = ["StragglerDetector", "write_stragglers_json"]


def __getattr__(name: str) -> Any:  # lazy: keep `import lightning_ncclx.straggler` free of Lightning
    if name == "StragglerDetector":
        from lightning_ncclx.straggler.callback import StragglerDetector

        return StragglerDetector
    if name == "write_stragglers_json":
        from lightning_ncclx.straggler.runtime import write_stragglers_json

        return write_stragglers_json
    raise AttributeError(name)
