"""The summarizing rank of a stall dies as it ends the job (SIGKILL), in real 3-rank jobs started
by hand (no launcher that kills the job when a rank dies): before it writes the event's exit
outcome, or after writing it but before its bells ring. The other ranks see its process gone on
their host and do not wait for an answer that cannot come (the exit order it wrote is read at
once; without one each rank decides alone once stuck past its own threshold), and the store's
host does not wait for the dead rank to say it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog import harness
from watchdog.harness import STALL_EXIT_CODE

pytestmark = pytest.mark.timeout(300)
KILL_JOB = Path(__file__).parent / "jobs" / "initiator_killed_job.py"
INITIATOR = 2
STUCK = 1


@pytest.mark.parametrize("when", ["before_ring", "before_outcome"])
def test_the_others_leave_without_waiting_for_a_sigkilled_initiator(tmp_path: Path, when: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "killed-initiator"
    monkeypatch.setattr(harness, "JOB", KILL_JOB)
    monkeypatch.setenv("NCCLX_TEST_KILL_INITIATOR", f"{when},{marker}")
    result = harness.run_ranks_by_hand(tmp_path, 3, "--fault", "stuck_train", "--fault-rank", str(STUCK),
                                       "--noticer-rank", str(INITIATOR), "--slow-rank-threshold", "6",
                                       timeout=200.0)
    log = result.log
    assert marker.is_file() and marker.read_text() == str(INITIATOR), log[-6000:]
    assert result.returncode == STALL_EXIT_CODE, (result.returncode, log[-6000:])  # ranks 0 and 1: 75; rank 2: -9
    logs = {rank: (tmp_path / f"rank{rank}.log").read_text(errors="replace") for rank in range(3)}
    gone = f"stall-001: the process of the summarizing rank {INITIATOR} is gone"
    assert any(gone in logs[rank] for rank in (0, STUCK)), log[-6000:]  # the first to see it rings the others
    for rank in (0, STUCK):
        assert "never said how the event ended" not in logs[rank], logs[rank][-4000:]
        assert f"[rank {rank}] stall-001: on_stall=dump_and_exit, exiting with code {STALL_EXIT_CODE}" in logs[rank]
        alone = f"the summarizing rank {INITIATOR} is gone without saying how the event ended"
        assert (alone in logs[rank]) == (when == "before_outcome"), logs[rank][-4000:]
    assert f"[rank 0] stall-001: not waiting for rank(s) [{INITIATOR}] to leave: their process is gone" in logs[0], \
        logs[0][-4000:]
