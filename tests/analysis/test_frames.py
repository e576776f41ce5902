"""Which known library wait a rank's main thread is in, from its stacks file."""

from __future__ import annotations

from lightning_ncclx.analysis.frames import main_thread_activity, main_thread_user_frame

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


def _stacks(*frames: tuple[str, int, str]) -> str:
    """The plugin's stacks-file form: an other thread first, then the main thread, outermost frame first."""
    lines = ["# Python stacks, pid 1", "", "--- thread 'ncclx-watchdog-rank0' (id 2) ---",
             f'  File "{STDLIB}/threading.py", line 320, in wait', "    waiter.acquire()", "",
             "--- thread 'MainThread' (id 1) ---"]
    for file, line, func in frames:
        lines += [f'  File "{file}", line {line}, in {func}', "    code()"]
    return "\n".join(lines) + "\n"


FIT = ("/home/user/train.py", 40, "main")


def test_a_loader_with_workers_is_named_as_the_data_loader_not_as_a_lock():
    text = _stacks(FIT, (f"{SITE}/torch/utils/data/dataloader.py", 1133, "_try_get_data"),
                   (f"{STDLIB}/queue.py", 180, "get"), (f"{STDLIB}/threading.py", 331, "wait"))
    activity = main_thread_activity(text)
    assert activity is not None and activity.startswith("waiting for the data loader: ")
    assert "_try_get_data" in activity
    assert main_thread_user_frame(text) == "/home/user/train.py:40 in main"


def test_checkpoint_gpu_sync_and_store_barrier_are_recognized():
    assert main_thread_activity(_stacks(FIT, (f"{SITE}/torch/serialization.py", 900, "save"))).startswith(
        "reading or writing a checkpoint")
    assert main_thread_activity(_stacks(FIT, (f"{SITE}/torch/cuda/__init__.py", 980, "synchronize"))).startswith(
        "in torch.cuda.synchronize")
    assert main_thread_activity(_stacks(
        FIT, (f"{SITE}/torch/distributed/distributed_c10d.py", 4800, "_store_based_barrier"))).startswith(
        "in a store-based barrier")


def test_the_watchdog_threads_own_wait_and_plain_user_code_are_not_an_activity():
    assert main_thread_activity(_stacks(FIT, ("/home/me/model.py", 12, "forward"))) is None
    assert main_thread_activity("no frames at all") is None
