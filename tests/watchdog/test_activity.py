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
    assert _frame_running_in("/home/user/train.py") is None
    assert _frame_running_in("/venv/site-packages/torch/distributed/distributed_c10d.py") is None
    assert phase_of_frames(None) is None


def _site_inside_hook(caller: str) -> str | None:
    """The site seen from inside a callback's hook that Lightning's call.py ``caller`` runs."""
    from lightning_ncclx.watchdog.activity import site_of_frames

    user = {"site_of_frames": site_of_frames, "sys": sys}
    exec(compile("class Uploader:\n"
                 "    def on_train_batch_end(self):\n"
                 "        return upload()\n"
                 "def upload():\n"
                 "    return site_of_frames(sys._getframe())\n", "/home/user/train.py", "exec"), user)
    lightning = {}
    exec(compile(f"def {caller}(fn):\n    return fn()\n",
                 "/venv/site-packages/lightning/pytorch/trainer/call.py", "exec"), lightning)
    return lightning[caller](user["Uploader"]().on_train_batch_end)


def test_a_site_names_the_lightning_hook_and_the_innermost_user_frame() -> None:
    assert _site_inside_hook("_call_callback_hooks") == (
        "Callback.on_train_batch_end of Uploader at /home/user/train.py:5 in upload")
    assert _site_inside_hook("_call_lightning_module_hook").startswith("LightningModule.on_train_batch_end of Uploader")


def test_outside_any_hook_the_site_is_the_user_frame_or_the_innermost_one() -> None:
    from lightning_ncclx.watchdog.activity import site_of_frames

    assert site_of_frames(None) is None
    here = site_of_frames(sys._getframe())
    assert here is not None and "test_activity.py" in here and " in test_outside_any_hook" in here
    scope = {"site_of_frames": site_of_frames, "sys": sys}
    exec(compile("def wait():\n    return site_of_frames(sys._getframe())\n",
                 "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "exec"), scope)
    library_only = scope["wait"]()  # called from this test file: the test's frame is the user's code
    assert library_only is not None and "test_activity.py" in library_only
