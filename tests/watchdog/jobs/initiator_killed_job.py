"""The watchdog tests' job (``jobs/train_job.py``, same arguments) whose summarizing rank dies as
it ends the job. ``$NCCLX_TEST_KILL_INITIATOR=<when>,<marker path>``: the initiator of an event
SIGKILLs itself when it is about to write the event's exit outcome (``before_outcome``) or once
the outcome is written, before any bell rings (``before_ring``), and first creates the marker
file (its rank inside). Rank 0 (the store's host) never kills itself."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning_ncclx.events.coordinator import EventCoordinator  # noqa: E402

import train_job  # noqa: E402


def _die(marker: str, rank: int) -> None:
    Path(marker).write_text(str(rank))
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_the_initiator(when: str, marker: str) -> None:
    set_outcome, ring_all = EventCoordinator.set_outcome, EventCoordinator._ring_all

    def set_outcome_or_die(self, event, outcome):  # noqa: ANN001, ANN202
        if when == "before_outcome" and outcome.exit and self.rank == event.initiator != 0:
            _die(marker, self.rank)
        return set_outcome(self, event, outcome)

    def ring_all_or_die(self, meta, what):  # noqa: ANN001, ANN202
        if when == "before_ring" and what == "outcome" and self.rank == meta.initiator != 0:
            _die(marker, self.rank)
        return ring_all(self, meta, what)

    EventCoordinator.set_outcome = set_outcome_or_die
    EventCoordinator._ring_all = ring_all_or_die


if os.environ.get("NCCLX_TEST_KILL_INITIATOR"):
    _kill_the_initiator(*os.environ["NCCLX_TEST_KILL_INITIATOR"].split(",", 1))

if __name__ == "__main__":
    sys.exit(train_job.main())
