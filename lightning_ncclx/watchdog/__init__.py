"""The stall watchdog: a daemon thread per rank fed by heartbeats at batch boundaries.

``StallWatchdog`` is the Lightning callback; ``Heartbeat`` holds the pure threshold logic.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StallWatchdog", "Heartbeat", "Phase"]


def __getattr__(name: str) -> Any:  # lazy: keep `import lightning_ncclx.watchdog` free of Lightning
    if name == "StallWatchdog":
        from lightning_ncclx.watchdog.callback import StallWatchdog

        return StallWatchdog
    if name in ("Heartbeat", "Phase"):
        from lightning_ncclx.watchdog import heartbeat

        return getattr(heartbeat, name)
    raise AttributeError(name)
