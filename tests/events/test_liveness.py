"""``is_gone`` on real processes: alive, exited but not reaped (zombie), reaped, pid reused; how a
zombie ended."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

from lightning_ncclx.events.liveness import ProcessInfo, is_gone, this_process


def _info_of(proc: subprocess.Popen) -> ProcessInfo:
    with open(f"/proc/{proc.pid}/stat") as f:
        raw = f.read()
    ticks = int(raw[raw.rindex(")") + 2:].split()[19])
    return ProcessInfo(7, "host", proc.pid, ticks, "scope")


def test_this_process_is_alive_and_round_trips_through_json() -> None:
    me = this_process(rank=3)
    assert me is not None and me.rank == 3 and not is_gone(me)
    assert me.scope.count("/") == 1 and "pid:[" in me.scope
    assert ProcessInfo.from_json(me.to_json(), world_size=4) == me


def test_an_exited_child_is_gone_before_and_after_it_is_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        info = _info_of(proc)
        assert not is_gone(info)
        proc.kill()
        deadline = time.monotonic() + 10
        while not is_gone(info) and time.monotonic() < deadline:  # a zombie until reaped
            time.sleep(0.02)
        assert is_gone(info)
    finally:
        proc.kill()
        proc.wait()
    assert is_gone(info)


def test_a_pid_now_used_by_another_process_is_gone() -> None:
    me = this_process(rank=0)
    assert me is not None and me.start_ticks is not None
    assert is_gone(dataclasses.replace(me, start_ticks=me.start_ticks + 1))


def test_a_process_whose_pid_cannot_be_read_is_never_called_gone() -> None:
    assert not is_gone(ProcessInfo(1, "host", 1, None, "scope"))


def test_how_a_zombie_ended_is_read_until_its_parent_reaps_it() -> None:
    from lightning_ncclx.events.liveness import describe_wait_status, wait_status_of

    aborts = subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(0.2); os.abort()"])
    exits = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    try:
        infos = {"abort": _info_of(aborts), "exit": _info_of(exits)}
        deadline = time.monotonic() + 30
        while not all(is_gone(i) for i in infos.values()) and time.monotonic() < deadline:  # zombies until reaped
            time.sleep(0.02)
        statuses = {k: wait_status_of(i) for k, i in infos.items()}
        assert describe_wait_status(statuses["abort"]) == {"signal": "SIGABRT", "status": 134}, statuses
        assert describe_wait_status(statuses["exit"]) == {"signal": None, "status": 3}, statuses
    finally:
        aborts.kill()
        exits.kill()
        aborts.wait()
        exits.wait()
    assert wait_status_of(infos["abort"]) is None  # reaped: only the parent knew
