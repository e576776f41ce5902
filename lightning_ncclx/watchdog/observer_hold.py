"""Hold Lightning's child-process observer while this process summarizes an event.

Lightning's own launcher runs local rank 0 in the launching process; a thread there polls the
other ranks every 5 s and, as soon as one has exited with an error, SIGKILLs them all and the
launching process itself. When that rank died on its own (gloo aborts a rank whose peer skipped
a collective), the launching rank may be writing the event's summary at that moment: the kill
lost it. While :func:`summarizing` is active the observer's kill waits, at most
``HOLD_SECONDS``; nothing else about the observer changes.

Example::

    install()                 # once, from the watchdog's start
    with summarizing():
        result = gather_and_summarize(...)
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

log = logging.getLogger(__name__)

HOLD_SECONDS = 60.0
OBSERVER_MODULES = ("lightning.fabric.strategies.launchers.subprocess_script",
                    "lightning_fabric.strategies.launchers.subprocess_script")
_summarizing = threading.Event()


@contextmanager
def summarizing() -> Iterator[None]:
    _summarizing.set()
    try:
        yield
    finally:
        _summarizing.clear()


def install() -> None:
    """Wrap the observer's kill in every Lightning flavour already imported (idempotent; a
    Lightning without the observer is left alone)."""
    for name in OBSERVER_MODULES:
        module = sys.modules.get(name)
        observer = getattr(module, "_ChildProcessObserver", None) if module is not None else None
        kill = getattr(observer, "_terminate_all", None)
        if kill is None or getattr(kill, "ncclx_hold", False):
            continue
        observer._terminate_all = _held(kill)  # type: ignore[union-attr]


def _held(kill: Any) -> Any:
    def _terminate_all(self: Any) -> None:
        if _summarizing.is_set():
            log.warning("a rank exited with an error while this process summarizes an event: the launcher's "
                        "kill waits for the summary (at most %.0f s)", HOLD_SECONDS)
            deadline = time.monotonic() + HOLD_SECONDS
            while _summarizing.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
        kill(self)

    _terminate_all.ncclx_hold = True  # type: ignore[attr-defined]
    return _terminate_all
