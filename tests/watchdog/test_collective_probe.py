"""``watchdog/collective_probe.py``: reading which collective a rank waits in from the recorder's
``pg_status`` - the counters' rules not covered in ``tests/watchdog/test_consensus.py`` (oldest
active op, group ids of either type, completed entries ignored), the label and ordering of
``BlockedIn``, and ``blocked_collectives`` on a real 1-rank gloo group: nothing while idle,
gloo's status read without entries, a failing read left out. (A real blocked wait, seen from
another thread, is ``tests/watchdog/test_consensus_jobs.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from support import one_rank_gloo
from lightning_ncclx.watchdog import collective_probe
from lightning_ncclx.watchdog.collective_probe import BlockedIn, blocked_collectives, blocked_from_status, p2p_from_entries


@pytest.fixture
def gloo_world(tmp_path: Path):
    with one_rank_gloo(tmp_path / "store", sub_desc="sub", calls_in_sub=2):
        yield


def _this_worlds(blocked: list[BlockedIn]) -> list[BlockedIn]:
    """The waits in this test's two groups: the recorder keeps the status of groups destroyed by
    earlier tests in this process (some left mid-op), and gives each new group the next id."""
    import json

    from lightning_ncclx.backend.torch_api import dump_fr_trace_json

    ids = sorted((int(k) for k in json.loads(dump_fr_trace_json(False, True, "gloo"))["pg_status"]), reverse=True)
    return [b for b in blocked if int(b.pg_id) >= ids[min(1, len(ids) - 1)]]


def test_label_and_order() -> None:
    assert BlockedIn("nccl2", "3", 17).label() == "nccl2 group 3 op 17"
    items = [BlockedIn("nccl", "1", 5), BlockedIn("gloo", "2", 1), BlockedIn("gloo", "1", 9), BlockedIn("gloo", "1", 3)]
    assert sorted(items) == [BlockedIn("gloo", "1", 3), BlockedIn("gloo", "1", 9), BlockedIn("gloo", "2", 1),
                             BlockedIn("nccl", "1", 5)]


def test_the_first_unfinished_op_follows_the_last_completed_one() -> None:
    status = {"0": {"last_enqueued_collective": 44, "last_completed_collective": 40},
              "5": {"last_enqueued_collective": 7, "last_completed_collective": 7},
              "6": {"last_enqueued_collective": 3, "last_completed_collective": 9}}  # odd, but not blocked
    assert blocked_from_status("nccl2", status, None) == [BlockedIn("nccl2", "0", 41)]


def test_without_a_completed_counter_the_oldest_active_entry_of_that_group_decides() -> None:
    status = {"0": {"last_enqueued_collective": 30},  # no completed counter at all
              "2": {"last_enqueued_collective": 12, "last_completed_collective": -1}}
    entries = [{"pg_id": "0", "op_id": "29", "state": "started"},
               {"pg_id": 0, "op_id": 28, "state": "scheduled"},  # the same group, an int id
               {"pg_id": 0, "op_id": 20, "state": "completed"},  # finished: not a wait
               {"pg_id": 2, "op_id": None, "state": "started"},  # no usable op id
               {"pg_id": 3, "op_id": 1, "state": "started"},  # a group not in the status
               "garbage"]
    assert blocked_from_status("nccl", status, entries) == [BlockedIn("nccl", "0", 28)]
    assert blocked_from_status("nccl", status, None) == []  # nothing to decide with


def test_a_group_never_used_is_not_blocked() -> None:
    assert blocked_from_status("gloo", {"0": {"last_enqueued_collective": -1, "last_completed_collective": -1}},
                               [{"pg_id": 0, "op_id": 0, "state": "started"}]) == []


def test_no_process_group_means_no_wait() -> None:
    assert not dist.is_initialized()
    assert blocked_collectives() == []


def test_an_idle_gloo_rank_waits_in_nothing(gloo_world) -> None:
    """gloo updates the completed counter on its worker thread just after the caller's wait
    returns (a loaded machine showed the last all_reduce unfinished there): idle once it settles.
    The bound is generous: a clean-clone run with both cores overloaded saw it unsettled after 10 s."""
    from watchdog.harness import wait_for

    assert wait_for(lambda: _this_worlds(blocked_collectives()) == [], 60.0), blocked_collectives()


def test_gloo_status_is_read_without_entries_and_each_group_reported(gloo_world, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real status, with the subgroup's completed counter set back by one: a wait in its next
    op. (The recorder keys groups by a process-wide id that keeps counting across worlds, and keeps
    the status of destroyed groups: the subgroup is the newest id.)"""
    real = collective_probe._status_json
    asked: list[tuple[str, bool]] = []
    newest: list[str] = []

    def one_behind(file_tag: str, include_entries: bool) -> dict:
        asked.append((file_tag, include_entries))
        data = real(file_tag, include_entries)
        newest.append(max(data["pg_status"], key=int))
        group = data["pg_status"][newest[-1]]
        group["last_completed_collective"] = str(int(group["last_enqueued_collective"]) - 1)
        return data

    monkeypatch.setattr(collective_probe, "_status_json", one_behind)
    found = _this_worlds(blocked_collectives())
    assert found == [BlockedIn("gloo", newest[0], 2)]  # two all_reduces in the subgroup: op 2 unfinished
    assert asked == [("gloo", False)]


def test_a_recorder_that_cannot_be_read_is_left_out(gloo_world, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(file_tag: str, include_entries: bool) -> dict:
        raise RuntimeError("json dump failed")

    monkeypatch.setattr(collective_probe, "_status_json", failing)
    assert blocked_collectives() == []


def test_nccl_recorders_show_unfinished_sends_and_recvs_with_global_peers() -> None:
    """Legacy NCCL and nccl2's hook record p2p as entries (``nccl:send 0->1``, ``is_p2p``): the
    unfinished ones are waits; group ranks become global ranks through pg_config."""
    pg_config = {"3": {"name": "3", "desc": "pp", "ranks": "[4, 6]"}}
    entries = [{"is_p2p": True, "state": "started", "profiling_name": "nccl:recv 0<-1", "process_group": ["3", "pp"],
                "op_id": 12},
               {"is_p2p": True, "state": "scheduled", "profiling_name": "nccl2:send 0->1", "process_group": ["3", "pp"],
                "op_id": 13},
               {"is_p2p": True, "state": "completed", "profiling_name": "nccl:send 0->1", "process_group": ["3", "pp"],
                "op_id": 11},  # finished: not a wait
               {"is_p2p": False, "state": "started", "profiling_name": "nccl:all_reduce", "process_group": ["0", ""],
                "op_id": 40},  # a collective: blocked_collectives' business
               {"is_p2p": True, "state": "started", "profiling_name": "nccl:recv ?<-0", "process_group": ["9", "x"],
                "op_id": 2},  # a group pg_config does not know: peer unknown
               {"is_p2p": True, "state": "started", "profiling_name": "nccl:broadcast", "process_group": ["3", "pp"],
                "op_id": 14}, "garbage", {"is_p2p": True, "profiling_name": "nccl:send 0->1", "op_id": "x"}]
    waits = p2p_from_entries("nccl", entries, pg_config)
    assert [(w.group, w.op_id, w.op, w.src, w.dst, w.peer, w.backend) for w in waits] == [
        ("3", 12, "recv", 1, 0, 6, "nccl"), ("3", 13, "send", 0, 1, 6, "nccl"), ("9", 2, "recv", 0, -1, -1, "nccl")]
    assert p2p_from_entries("nccl", "not a list", pg_config) == []


def test_gloo_sends_and_recvs_in_flight_are_seen_through_the_process_group_hooks(tmp_path: Path) -> None:
    """A real 3-rank gloo pipeline (jobs/p2p_probe_job.py): rank 1 waits in recv from rank 0 on the
    default group, rank 2 in irecv().wait() from rank 1 on a group made after the tracker first
    attached. gloo's recorder shows neither; completed ops and a detached tracker leave nothing."""
    import json
    import os
    import subprocess
    import sys

    from support import free_port

    job = Path(__file__).parent / "jobs" / "p2p_probe_job.py"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(job), str(r), port, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for r in range(3)]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    found = [json.loads(next(line for line in out.splitlines() if line.startswith("PROBE "))[6:]) for out in outputs]
    assert [f["hooked_later"] for f in found] == [1, 2, 2]  # rank 0 is no member of the sub-group
    assert found[1]["waits"] == [["gloo", "0", "recv", 0, 1, 0]] and found[1]["collectives"] == []
    assert found[2]["waits"] == [["gloo", "1", "recv", 0, 1, 1]]  # group ranks 0 -> 1; global peer 1
    assert found[1]["context"][0]["sizes"] == [[4]] and found[1]["context"][0]["seconds"] >= 0.5
    for f in found:
        assert f["after_healthy"] == [] and f["after"] == [] and f["after_detach"] == []


def test_every_kind_of_wait_is_seen_on_gloo(tmp_path: Path) -> None:
    """Real 2-rank gloo waits in each kind of op (jobs/wait_kinds_job.py): the first op of a new
    group (its completed counter still -1), the tensor forms FSDP uses, a coalesced op, a device
    mesh's group, an async op's wait, and batched point-to-point."""
    import json
    import os
    import subprocess
    import sys

    from support import free_port

    job = Path(__file__).parent / "jobs" / "wait_kinds_job.py"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(job), str(r), port, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for r in range(2)]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    seen = json.loads(next(line for line in outputs[0].splitlines() if line.startswith("SEEN "))[5:])
    assert seen.pop("batch_isend_irecv") == [[], [["recv", 1]]]
    assert len(seen) == 5
    for kind, (collectives, p2p) in seen.items():
        assert len(collectives) == 1 and collectives[0][0] == "gloo" and p2p == [], (kind, collectives, p2p)
    assert seen["all_gather_into_tensor, first op of a new group"][0] == [["gloo", 1]]


def test_a_gloo_group_whose_first_op_is_unfinished_waits_in_op_one() -> None:
    status = {"4": {"last_enqueued_collective": "1", "last_completed_collective": "-1"},
              "5": {"last_enqueued_collective": "3", "last_completed_collective": "-1"}}
    assert blocked_from_status("gloo", status, None) == [BlockedIn("gloo", "4", 1), BlockedIn("gloo", "5", 1)]
    assert blocked_from_status("nccl", status, None) == []  # NCCL's -1 may mean unknown: entries decide


def test_nccl_p2p_entries_are_read_only_when_a_groups_counters_show_an_unfinished_op(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCCL path as it reads torch's JSON dump (no GPU here: the dump's content is given)."""
    from lightning_ncclx.dump.traces import BackendInUse

    recv = {"is_p2p": True, "state": "started", "profiling_name": "nccl2:recv 1<-0", "process_group": ["1", "pp"],
            "op_id": 8}
    dumps = {False: {"pg_status": {"1": {"last_enqueued_collective": "8", "last_completed_collective": "7"}}},
             True: {"entries": [recv], "pg_config": {"1": {"desc": "pp", "ranks": "[2, 5]"}}}}
    asked: list[tuple[str, bool]] = []

    def status(file_tag: str, include_entries: bool) -> dict:
        asked.append((file_tag, include_entries))
        return dumps[include_entries]

    monkeypatch.setattr(collective_probe, "backends_in_use", lambda: [BackendInUse("cuda", "nccl2"),
                                                                      BackendInUse("cpu", "gloo")])
    monkeypatch.setattr(collective_probe, "_status_json", status)
    waits = collective_probe.p2p_waits()
    assert [(w.backend, w.group, w.op, w.peer) for w in waits] == [("nccl2", "1", "recv", 2)]
    assert asked == [("nccl2", False), ("nccl2", True)]  # gloo's come from the hooks, never from its recorder
    dumps[False]["pg_status"]["1"]["last_completed_collective"] = "8"
    asked.clear()
    assert collective_probe.p2p_waits() == [] and asked == [("nccl2", False)]
