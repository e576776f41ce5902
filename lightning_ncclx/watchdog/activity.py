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
    "/torch/_dynamo/convert_frame.py",
    "/torch/_dynamo/symbolic_convert.py",
    "/torch/_dynamo/output_graph.py",
    "/torch/_functorch/aot_autograd.py",
    "/torch/_functorch/_aot_autograd/graph_compile.py",
    "/torch/_functorch/_aot_autograd/graph_capture.py",
    "/torch/_inductor/compile_fx.py",
    "/torch/_inductor/async_compile.py",
    "/torch/_inductor/graph.py",
    "/torch/_inductor/scheduler.py",
    "/torch/_inductor/codegen/",
    "/triton/compiler/",
)
"""Files that run only while compiling. Not ``torch/_dynamo/eval_frame.py`` (the entry of compiled
code, and of every ``torch._dynamo.disable`` wrapper: FSDP2 runs its hooks, and so its
all-gathers, under one), nor the runtime of compiled graphs (``_aot_autograd/runtime_wrappers``,
``_inductor/output_code``, ``_inductor/runtime``): a rank waiting there is not compiling."""
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


_HOOK_CALLERS = {
    "_call_callback_hooks": "Callback",
    "_call_lightning_module_hook": "LightningModule",
    "_call_strategy_hook": "Strategy",
    "_call_lightning_datamodule_hook": "LightningDataModule",
}
_LIGHTNING_CALL = ("/pytorch/trainer/call.py", "/pytorch_lightning/trainer/call.py")


def _short_path(filename: str) -> str:
    name = _normalized(filename)
    for marker in ("site-packages/", "dist-packages/"):
        if marker in name:
            return name.split(marker, 1)[1]
    return name


def site_of_frames(frame: FrameType | None) -> str | None:
    """Where a thread is, stable across steps and epochs: the Lightning hook it runs (innermost:
    ``Callback.on_train_batch_end of Uploader``) and its innermost frame of the user's own code
    (``train.py:88 in upload``), joined by `` at ``; else its innermost frame (a loader waiting in
    torch). None for no frame."""
    from lightning_ncclx.analysis.frames import is_library_file

    hook = user = innermost = None
    callee: FrameType | None = None
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        code = frame.f_code
        name = _normalized(code.co_filename)
        if innermost is None:
            innermost = f"{_short_path(name)}:{frame.f_lineno} in {code.co_name}"
        if user is None and not is_library_file(name):
            user = f"{_short_path(name)}:{frame.f_lineno} in {code.co_name}"
        if hook is None and callee is not None and name.endswith(_LIGHTNING_CALL) and code.co_name in _HOOK_CALLERS:
            owner = getattr(callee.f_code, "co_qualname", callee.f_code.co_name).rpartition(".")[0]
            hook = f"{_HOOK_CALLERS[code.co_name]}.{callee.f_code.co_name}" + (f" of {owner}" if owner else "")
        callee, frame = frame, frame.f_back
        depth += 1
    parts = [p for p in (hook, user) if p]
    return " at ".join(parts) if parts else innermost


def main_thread_site() -> str | None:
    """:func:`site_of_frames` of the main thread's current stack."""
    ident = threading.main_thread().ident
    if ident is None:
        return None
    return site_of_frames(sys._current_frames().get(ident))
