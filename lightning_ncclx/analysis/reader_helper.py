"""Untrusted dumps read in a helper process where this one cannot fork: a training job.

Inside a training job (torch loaded, its threads running) forking is unsafe, yet the summarizing
rank reads dumps that came from the store or from another rank: a few hundred bytes of pickle can
hold the GIL for hours inside the C unpickler (see :mod:`reader_pool`). So the reading is handed to
a fresh interpreter (``python -c``: no torch, one thread), which forks its readers as ``summarize``
does, each file under its deadline, and sends the results back through a pipe. The helper as a
whole runs under a deadline too (every file's, plus its start): past it, it is killed and every
file it held is named unreadable. The training process only waits on a pipe, never in the
unpickler.

Example::

    traces = call_in_helper(read_files, (jobs, 1), deadline_s=40.0, what=[j.path for j in jobs])
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from lightning_ncclx.analysis.model import Unreadable

log = logging.getLogger(__name__)

START_S = 30.0
"""What the helper may take to start and send its answer, on top of its files' deadlines."""

T = TypeVar("T")

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_CHILD = ("import sys; sys.path.insert(0, {root!r}); "
          "from lightning_ncclx.analysis.reader_helper import helper_main; helper_main()")


class HelperUnavailable(RuntimeError):
    """The helper process could not be started (no interpreter to run): the caller decides."""


def call_in_helper(function: Callable[..., list[T]], args: tuple[Any, ...], *, deadline_s: float,
                   what: Sequence[str]) -> list[T | Unreadable]:
    """``function(*args)`` in a fresh interpreter; ``function`` is module-level and returns one
    item per name of ``what``. When the helper overruns ``deadline_s`` or fails, every name of
    ``what`` comes back :class:`Unreadable` with the reason. Raises :class:`HelperUnavailable`."""
    if not sys.executable:
        raise HelperUnavailable("sys.executable is empty")
    request = pickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD.format(root=_PACKAGE_ROOT)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=None, close_fds=True)
    except OSError as error:
        raise HelperUnavailable(str(error)) from error
    try:
        answer, _ = proc.communicate(request, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return _all_unreadable(what, f"the helper process reading it was stopped after {deadline_s:.0f} s")
    if proc.returncode != 0:
        return _all_unreadable(what, f"the helper process reading it exited with status {proc.returncode}")
    try:
        # The answer is this package's own objects, written by the child this process started
        # from its own request: no stranger's bytes are unpickled here.
        results = pickle.loads(answer)
    except Exception as error:  # noqa: BLE001 - a child killed while writing
        return _all_unreadable(what, f"the helper process's answer was cut short ({type(error).__name__})")
    if not isinstance(results, list) or len(results) != len(what):
        return _all_unreadable(what, "the helper process answered for other files")
    return results


def _all_unreadable(what: Sequence[str], why: str) -> list[Any]:
    log.warning("reading %d dump file(s) failed: %s", len(what), why)
    return [Unreadable(path, why) for path in what]


def helper_main() -> None:
    """The child's side: one request on stdin, one answer on stdout (the pipe, kept apart from
    what anything prints)."""
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    function, args = pickle.loads(sys.stdin.buffer.read())  # the parent's own request
    results = function(*args)
    answer.write(pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL))
    answer.flush()
