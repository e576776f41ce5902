"""Put first on a rank's ``PYTHONPATH``: that process's ``time.time`` runs ``CLOCK_AHEAD_SECONDS``
ahead (a host whose clock is wrong); its monotonic clock, the store and torch stay real."""

import os
import time

_AHEAD = float(os.environ.get("CLOCK_AHEAD_SECONDS", "0"))
_real_time = time.time


def _ahead() -> float:
    return _real_time() + _AHEAD


if _AHEAD:
    time.time = _ahead
