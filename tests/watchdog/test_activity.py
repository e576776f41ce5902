"""Reading what the main thread does from its stack: compiling, saving a checkpoint, or neither."""

from __future__ import annotations

import sys
import threading

from lightning_ncclx.watchdog.activity import phase_of_frames
from lightning_ncclx.watchdog.heartbeat import Phase


def _frame_running_in(filename: str):
    """A real frame whose code comes from ``filename``, captured while it runs on a thread."""
    ready, release, captured = threading.Event(), threading.Event(), {}
    code = compile("ready.set()\nrelease.wait(10)\n", filename, "exec")

    def run() -> None:
        exec(code, {"ready": ready, "release": release})

    thread = threading.Thread(target=run)
    thread.start()
    ready.wait(10)
    captured["frame"] = sys._current_frames()[thread.ident]
    phase = phase_of_frames(captured["frame"])
    release.set()
    thread.join()
    return phase


def test_compiling_gets_the_first_step_allowance() -> None:
    assert _frame_running_in("/venv/lib/python3.11/site-packages/torch/_dynamo/convert_frame.py") is Phase.first_step
    assert _frame_running_in("/venv/site-packages/torch/_inductor/compile_fx.py") is Phase.first_step


def test_running_compiled_code_or_a_dynamo_disabled_hook_is_not_compiling() -> None:
    """FSDP2 runs its pre-forward hook (and the all-gather a hung rank waits in) under
    ``torch._dynamo.disable``, whose wrapper lives in eval_frame.py."""
    assert _frame_running_in("/venv/site-packages/torch/_dynamo/eval_frame.py") is None
    assert _frame_running_in("/venv/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py") is None
    assert _frame_running_in("/venv/site-packages/torch/_inductor/output_code.py") is None


def test_saving_gets_the_checkpoint_allowance() -> None:
    assert _frame_running_in("/venv/site-packages/torch/distributed/checkpoint/state_dict_saver.py") is Phase.checkpoint
    assert _frame_running_in("/venv/site-packages/torch/serialization.py") is Phase.checkpoint


def test_ordinary_code_gets_no_allowance() -> None:
    assert _frame_running_in("/home/me/train.py") is None
    assert _frame_running_in("/venv/site-packages/torch/distributed/distributed_c10d.py") is None
    assert phase_of_frames(None) is None
