"""Hold a launcher's termination signal while the main thread writes an exception's evidence.

When a rank raises, torchrun (and SLURM, and Lightning's own launcher) sends SIGTERM to the
other ranks moments later. Python runs a SIGTERM handler in the main thread, inside whatever
Python code runs there: during the exception dump, Lightning's handler broadcasts on the default
group, which raises once a peer is gone, and that exception would cut the dump or the summary
short. While :func:`signals_held` is open, the signal is only noted; when it closes the handler
that stood before is put back and the signal delivered again, so the launcher's intent is
carried out right after the evidence is on disk (within the bounded time of the dump).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

HELD_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM,)


@contextmanager
def signals_held(numbers: tuple[signal.Signals, ...] = HELD_SIGNALS) -> Iterator[None]:
    """Main thread only (Python's rule for handlers); elsewhere it holds nothing. A handler set
    outside Python (Python reads ``None``) is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def note(signum: int, frame: Any) -> None:
        arrived.append(signum)

    previous: dict[signal.Signals, Any] = {}
    for number in numbers:
        try:
            before = signal.getsignal(number)
            if before is None or before is signal.SIG_IGN:
                continue
            signal.signal(number, note)
            previous[number] = before
        except (ValueError, OSError, TypeError):
            log.debug("could not hold signal %s", number, exc_info=True)
    try:
        yield
    finally:
        for number, before in previous.items():
            try:
                if signal.getsignal(number) is note:  # a handler set meanwhile stands
                    signal.signal(number, before)
            except (ValueError, OSError, TypeError):
                log.warning("could not put back the handler of %s", signal.Signals(number).name, exc_info=True)
        for number in dict.fromkeys(arrived):
            _deliver(number)


def _deliver(number: int) -> None:
    name = signal.Signals(number).name
    log.info("%s arrived while the exception's evidence was written: delivered now", name)
    try:
        signal.raise_signal(number)  # the handler runs here (main thread), or the default action ends the process
    except Exception as error:  # noqa: BLE001 - the training's own exception is already on its way up
        log.warning("the %s handler raised %s: %s (the training's exception goes on)", name, type(error).__name__,
                    str(error)[:300])
