"""Live straggler detection: name the slow rank, its host and the slow part of its step while
training runs. ``StragglerDetector`` is the Lightning callback (attached by the ncclx strategies);
its ``write_stragglers_json`` writes what it knows into a folder (the watchdog hands it to its
runtime for the stall event's folder)."""

from __future__ import annotations

from typing import Any

__all__ = ["StragglerDetector"]


def __getattr__(name: str) -> Any:  # lazy: keep `import lightning_ncclx.straggler` free of Lightning
    if name == "StragglerDetector":
        from lightning_ncclx.straggler.callback import StragglerDetector

        return StragglerDetector
    raise AttributeError(name)
