"""One failure, one incident: what a rank's exception brings about on its peers (their dead
connection to it, their stall waiting for it) joins the exception's event instead of opening a
second one whose summary would contradict the first. Real 3-rank Lightning jobs on gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from watchdog.harness import assert_culprit, run_ranks_by_hand

pytestmark = pytest.mark.timeout(240)


def test_the_peers_failures_after_an_exception_join_its_incident(tmp_path: Path) -> None:
    """Rank 1 raises in training_step (``on_stall: dump``, the default): its event names it and
    advises no restart. Ranks 0 and 2 (started by hand: no launcher kills them when rank 1 exits)
    then wait in the step's all_reduce and raise "Connection closed by peer" once rank 1's process
    is gone: no second event (a summary naming rank 1 lost, advising a restart) follows, so the
    last summary keeps the advice."""
    result = run_ranks_by_hand(tmp_path, 3, "--fault", "raise", "--fault-rank", "1", "--strategy", "ddp_ncclx",
                               "--on-stall", "dump")
    assert result.returncode not in (0, None), result.log[-4000:]
    events = result.events()
    assert [e.name for e in events] == ["exception-rank1-001"], f"{events}\n{result.log[-6000:]}"
    summary = assert_culprit(events[0], 1, result.log)
    assert summary["culprit_ranks"] == [1], summary["findings"][0]["message"]
    assert summary["restart_advice"]["action"] == "do_not_restart", summary["restart_advice"]
    assert "part of that incident" in result.log, result.log[-4000:]
    contexts = [json.loads(p.read_text()) for p in events[0].glob("rank_*.context.json")]
    assert sorted(c["rank"] for c in contexts) == [0, 1, 2]
    assert [c["rank"] for c in contexts if c.get("exception")] == [1]  # the peers' later errors are no second cause
