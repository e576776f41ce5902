"""The consensus's "working" sample of the main thread on a CPU shared with busier processes:
a main thread that computes is working even when it gets a small share of the CPU (the time it
waits in the run queue once preempted counts), and one that sleeps 2 ms at a time is not, though
each of its wake-ups waits in that queue too. Shares of sampled CPU time, not durations."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import clean_env

PROBE = r"""
import json, os, sys, threading, time
from lightning_ncclx.watchdog.consensus import read_main_thread_cpu
mode = sys.argv[1]
result = {}

def sample():
    first, t0 = read_main_thread_cpu(), time.monotonic()
    time.sleep(1.0)
    result["share"] = (read_main_thread_cpu() - first) / (time.monotonic() - t0)
    done.set()

done = threading.Event()
threading.Thread(target=sample, daemon=True).start()
while not done.is_set():
    if mode == "sleep":
        time.sleep(0.002)
    else:
        sum(i * i for i in range(1000))
print(json.dumps(result))
"""

SPIN = "while True: pass"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/self/schedstat"),
                    reason="needs Linux CPU affinity and schedstat")
@pytest.mark.parametrize(("mode", "working"), [("compute", True), ("sleep", False)])
def test_a_main_thread_on_a_crowded_cpu_is_working_only_when_it_computes(mode: str, working: bool) -> None:
    cpu = min(os.sched_getaffinity(0))
    pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731 - every process on one CPU
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=pin) for _ in range(10)]
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, mode], preexec_fn=pin, capture_output=True, text=True,
                              env=clean_env(), timeout=120)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    assert done.returncode == 0, done.stderr
    share = json.loads(done.stdout)["share"]
    from lightning_ncclx.watchdog.consensus import WORKING_CPU_SHARE

    assert (share >= WORKING_CPU_SHARE) is working, share
