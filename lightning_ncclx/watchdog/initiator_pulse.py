"""The summarizing rank's sign of life, and how another rank reads it.

A rank that follows an event waits for the initiator's word (recovered, or the job ends). When
the initiator's process dies, a rank of its host sees that through ``/proc``
(:mod:`lightning_ncclx.events.liveness`); a rank on another host cannot, and without a sign of
life it would wait out the whole event window (confirmation, collection and a margin: about 75 s
at the defaults). So while an event is the initiator's to decide, a thread of its own (not the
watchdog thread, which may be busy collecting or summarizing another event) rewrites a count in
the store about once a second (:func:`~lightning_ncclx.events.keys.pulse_key`).

A follower reads that count only when it would leave on its own evidence anyway (its step stuck
past its own bar, no exit order yet), at most every ``check_gap`` seconds; once the count has not
changed for ``PULSE_STALE_SECONDS`` (plus a second per 256 ranks) on the follower's own monotonic
clock, the initiator is taken to be gone: the follower reads the outcome one last time and then
leaves as it would without one. The initiator beats from the moment it takes part, before it
writes its own dump, so a follower stuck past its bar finds a count unless the initiator died
first: a count never seen over the same window, counted from the follower's first read, judges
the initiator gone too. Any change of the raw value, a deletion included, counts as life. A
store client that keeps changing the key delays the judgement; one that overwrites it with one
value faster than the initiator beats brings it forward, but only for a rank already stuck past
its own threshold (a rank that makes progress never reads the key).

Example::

    pulse = InitiatorPulse(coordinator, lambda: [opened.event for opened in open_events if opened.initiator])
    pulse.ensure_started()
    ...
    pulse.stop()
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.wire import EventMeta

log = logging.getLogger(__name__)

PULSE_INTERVAL_SECONDS = 1.0
PULSE_STALE_SECONDS = 10.0
"""How long a follower waits on an unchanged count before it takes the initiator to be gone."""
PULSE_CHECK_SECONDS = 2.0
RANKS_PER_CHECK_SECOND = 1024
"""The followers' reads are spread with the job's size: at most one per this many ranks per second."""


def check_gap(world_size: int) -> float:
    """Seconds between one follower's reads of the count."""
    return max(PULSE_CHECK_SECONDS, world_size / RANKS_PER_CHECK_SECOND)


class InitiatorPulse:
    """A daemon thread, started at this rank's first event as initiator, that rewrites the count
    of every event ``events()`` lists until :meth:`stop`. Never raises into its caller; a failed
    write is logged (once per run of failures) and tried again at the next beat."""

    def __init__(self, coordinator: EventCoordinator, events: Callable[[], list[EventMeta]],
                 interval_seconds: float = PULSE_INTERVAL_SECONDS) -> None:
        self.coordinator = coordinator
        self.events = events
        self.interval = interval_seconds
        self.count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failing = False

    def ensure_started(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="ncclx-initiator-pulse", daemon=True)
                self._thread.start()

    def beat(self) -> None:
        """One write per event listed now (also called from tests, without the thread)."""
        self.count += 1
        try:
            for event in self.events():
                self.coordinator.set_pulse(event, self.count)
            if self._failing:
                log.info("[rank %d] the summarizing rank's sign of life reaches the store again", self.coordinator.rank)
            self._failing = False
        except Exception:  # noqa: BLE001 - the store may be busy or gone; the next beat tries again
            if not self._failing:
                log.warning("[rank %d] writing the summarizing rank's sign of life failed (tried again every %g s)",
                            self.coordinator.rank, self.interval, exc_info=True)
            self._failing = True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self.interval)

    def stop(self, timeout_seconds: float = 1.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_seconds)


@dataclass
class PulseWatch:
    """A follower's view of one event's count, on its own monotonic clock."""

    seen: bytes | None = None
    changed_at: float | None = None
    """When the count last changed, or, while none was ever seen, when it was first read."""
    next_read: float = 0.0

    def note(self, raw: bytes | None, now: float) -> None:
        if self.changed_at is None or raw != self.seen:
            self.seen, self.changed_at = raw, now

    def stopped_for(self, now: float) -> float:
        """Seconds the count has not changed (or has been absent) since this rank first read it."""
        return 0.0 if self.changed_at is None else now - self.changed_at


__all__ = ["InitiatorPulse", "PulseWatch", "PULSE_STALE_SECONDS", "check_gap"]
