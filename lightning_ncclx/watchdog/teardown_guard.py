"""A bound on the process's exit: ``destroy_process_group`` at exit is known to hang.

Lightning (and this plugin, for every NCCL-family backend) destroys the process group in an
``atexit`` handler, after the watchdog has stopped. The guard is registered when the watchdog
stops, so it runs before those handlers (``atexit`` runs the last registered first): it starts
a daemon timer, and if the process is still exiting ``teardown_seconds`` later it writes every
thread's Python stack to ``<dump_dir>/teardown-rank<R>.stacks.txt`` and, with
``on_stall: dump_and_exit``, ends the process with ``exit_code`` instead of hanging forever.
"""

from __future__ import annotations

import atexit
import logging
import threading
from pathlib import Path
from typing import Callable

from lightning_ncclx.layout import teardown_stacks_path

log = logging.getLogger(__name__)

_armed: dict[str, object] = {}
_lock = threading.Lock()


def guard_exit(dump_dir: Path, rank: int, seconds: float, exit_code: int | None,
               write_stacks: Callable[[], str], hard_exit: Callable[[int], None]) -> None:
    """Register (once per process; the latest settings win) the exit guard."""
    with _lock:
        first = not _armed
        _armed.update(dump_dir=Path(dump_dir), rank=rank, seconds=seconds, exit_code=exit_code,
                      write_stacks=write_stacks, hard_exit=hard_exit)
    if first:
        atexit.register(_start_timer)


def _start_timer() -> None:
    with _lock:
        settings = dict(_armed)
    timer = threading.Timer(float(settings["seconds"]), _on_hang, kwargs=settings)  # type: ignore[arg-type]
    timer.daemon = True
    timer.name = "ncclx-exit-guard"
    timer.start()


def _on_hang(*, dump_dir: Path, rank: int, seconds: float, exit_code: int | None,
             write_stacks: Callable[[], str], hard_exit: Callable[[int], None]) -> None:
    path = teardown_stacks_path(dump_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(write_stacks(), encoding="utf-8")
    except Exception:  # noqa: BLE001
        log.error("writing %s failed", path, exc_info=True)
    if exit_code is None:
        log.error("[rank %d] still exiting %.0f s after training ended (destroy_process_group?): stacks in %s",
                  rank, seconds, path)
        return
    log.error("[rank %d] still exiting %.0f s after training ended (destroy_process_group?): stacks in %s; "
              "exiting with code %d", rank, seconds, path, exit_code)
    hard_exit(exit_code)
