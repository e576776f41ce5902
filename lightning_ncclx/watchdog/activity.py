"""What the main thread is doing right now, read from its Python stack by the watchdog thread.

Looked at only when a step has already passed its threshold, so it costs nothing per step. A
step that is compiling (``torch.compile``'s first run, or a recompile after a shape change at
any step) or writing a checkpoint outside ``Trainer.save_checkpoint`` (a user's own
``torch.save`` or distributed checkpoint in a hook) is slow by nature: it gets that phase's
threshold instead of the learned step threshold.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType

from lightning_ncclx.watchdog.heartbeat import Phase

MAX_FRAMES = 400

_COMPILE_PATHS = (
    "/torch/_dynamo/",
    "/torch/_inductor/",
    "/torch/_functorch/_aot_autograd/",
    "/torch/_functorch/aot_autograd.py",
    "/triton/compiler/",
)
_CHECKPOINT_PATHS = (
    "/torch/distributed/checkpoint/",
    "/torch/serialization.py",
    "/trainer/connectors/checkpoint_connector.py",
    "/fabric/plugins/io/",
    "/pytorch/plugins/io/",
)


def _normalized(filename: str) -> str:
    return filename.replace("\\", "/")


def phase_of_frames(frame: FrameType | None) -> Phase | None:
    """``first_step`` when compiling, ``checkpoint`` when saving, else None (innermost first)."""
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        name = _normalized(frame.f_code.co_filename)
        if any(part in name for part in _COMPILE_PATHS):
            return Phase.first_step
        if any(part in name for part in _CHECKPOINT_PATHS):
            return Phase.checkpoint
        frame = frame.f_back
        depth += 1
    return None


def main_thread_phase() -> Phase | None:
    """:func:`phase_of_frames` of the main thread's current stack (None when it cannot be read)."""
    ident = threading.main_thread().ident
    if ident is None:
        return None
    return phase_of_frames(sys._current_frames().get(ident))
