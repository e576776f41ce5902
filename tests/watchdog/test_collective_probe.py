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
from lightning_ncclx.watchdog.collective_probe import BlockedIn, blocked_collectives, blocked_from_status


@pytest.fixture
def gloo_world(tmp_path: Path):
    with one_rank_gloo(tmp_path / "store", sub_desc="sub", calls_in_sub=2):
        yield


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
    assert blocked_collectives() == []


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
    assert blocked_collectives() == [BlockedIn("gloo", newest[0], 2)]  # two all_reduces in the subgroup: op 2 unfinished
    assert asked == [("gloo", False)]


def test_a_recorder_that_cannot_be_read_is_left_out(gloo_world, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(file_tag: str, include_entries: bool) -> dict:
        raise RuntimeError("json dump failed")

    monkeypatch.setattr(collective_probe, "_status_json", failing)
    assert blocked_collectives() == []
