"""The machine-wide rank slots that bound how many ranks of the gloo jobs run at once, across
pytest processes (two test sessions at once ran 84 ranks and the machine out of memory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gloo_jobs import RANK_MEMORY_BYTES, RankSlots, machine_rank_slots

_TAKE_ONE = """
import sys
sys.path.insert(0, {here!r})
from pathlib import Path
from gloo_jobs import RankSlots
print("got" if RankSlots(3, Path({folder!r})).take(1) is not None else "none")
"""


def _other_process_takes_one(folder: Path) -> str:
    code = _TAKE_ONE.format(here=str(Path(__file__).parent), folder=str(folder))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def test_a_slot_held_here_is_not_free_in_another_process_until_given_back(tmp_path):
    slots = RankSlots(3, tmp_path)
    held = slots.take(3)
    assert held is not None and len(held) == 3
    assert slots.take(1) is None  # not even to this process again
    assert _other_process_takes_one(tmp_path) == "none"
    slots.give(held)
    assert held == []
    assert _other_process_takes_one(tmp_path) == "got"  # and its lock went with it when it exited
    again = slots.take(3)
    assert again is not None
    slots.give(again)


def test_a_job_that_does_not_fit_holds_nothing(tmp_path):
    slots = RankSlots(3, tmp_path)
    one = slots.take(1)
    assert one is not None
    assert slots.take(3) is None
    two = slots.take(2)  # the failed attempt gave back what it had taken
    assert two is not None
    slots.give(one)
    slots.give(two)


def test_every_process_of_a_machine_counts_the_same_slots():
    assert machine_rank_slots(3, 24 << 30) == 24 * 1024 // 2 // (RANK_MEMORY_BYTES >> 20)
    assert machine_rank_slots(3, 1 << 30) == 3  # at least one job, however small the machine
    assert machine_rank_slots(3) == machine_rank_slots(3)
