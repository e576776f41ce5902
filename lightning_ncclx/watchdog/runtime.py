"""The per-rank watchdog thread and the dump events it runs.

Created in ``StallWatchdog.setup`` (never pickled), stopped on teardown and on exception. Every
poll interval the thread (1) looks in the store for an event another rank started, (2) starts
an on-demand event when the signal flag is set, (3) starts a stall event when the heartbeat is
older than its phase's threshold. It never calls a collective, and nothing it does raises into
training: errors are logged.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.config import StallAction, WatchdogConfig
from lightning_ncclx.dump.coordinator import EventCoordinator, EventInfo, open_job_store
from lightning_ncclx.dump.liveness import this_process
from lightning_ncclx.dump.summarize import CollectionResult, collect_and_summarize
from lightning_ncclx.dump.writer import host_name, write_rank_dump
from lightning_ncclx.watchdog.heartbeat import Heartbeat

log = logging.getLogger(__name__)

EXIT_WAIT_MARGIN_SECONDS = 60.0
"""How much longer than ``collect_timeout_seconds`` a rank waits for the summary before exiting."""


def _job_identity() -> tuple[int, int, Any]:
    """(rank, world size, store) of the running job; a private in-memory store without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), open_job_store()
    return 0, 1, dist.HashStore()


class WatchdogRuntime:
    """Thread, store client, signal handler and event bookkeeping of one rank."""

    def __init__(self, config: WatchdogConfig, dump_dir: Path, *, stack_traces: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 exit_fn: Callable[[int], None] | None = None) -> None:
        self.config = config
        self.dump_dir = Path(dump_dir)
        self.stack_traces = stack_traces
        self.heartbeat = Heartbeat(config, clock=clock)
        self.rank, self.world_size, store = _job_identity()
        self.coordinator = EventCoordinator(store, self.rank, self.world_size, clock=clock)
        self.coordinator.name_taken = lambda name: (self.dump_dir / name).exists()
        self.stall_events = 0
        self.events_taken_part = 0
        self.results: list[CollectionResult] = []
        self.on_dumped: Callable[[str], None] | None = None
        """Called from the watchdog thread after each dump of this rank, with the event's reason."""
        self.on_summarized: Callable[[CollectionResult], None] | None = None
        """Called on the initiating rank after an event's summary is written (hang kind known)."""
        self._exit_fn = exit_fn or _hard_exit
        self._event_lock = threading.Lock()
        self._stop = threading.Event()
        self._signal_requested = False
        self._signal_number: int | None = None
        self._previous_handler: Any = None
        self._last_on_demand = -math.inf
        self._clock = clock
        self._thread = threading.Thread(target=self._run, name=f"ncclx-watchdog-rank{self.rank}", daemon=True)

    # ------------------------------------------------------------------------------ life cycle
    def start(self) -> None:
        try:
            past = self.coordinator.skip_past_events()
            if past:
                log.debug("[rank %d] %d earlier dump event(s) in the store: skipped", self.rank, past)
            self.coordinator.register_process(this_process(self.rank))
        except Exception:  # noqa: BLE001 - a store that cannot answer now is retried by every poll
            log.warning("[rank %d] could not read earlier dump events or register this process in the store",
                        self.rank, exc_info=True)
        self._install_signal()
        self._thread.start()
        log.debug("[rank %d] stall watchdog started, dumps go to %s", self.rank, self.dump_dir)

    def stop(self, timeout_seconds: float | None = None) -> None:
        self._stop.set()
        self._restore_signal()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_seconds if timeout_seconds is not None else max(2.0, 4 * self.config.poll_interval_seconds))
            if self._thread.is_alive():
                log.warning("[rank %d] watchdog thread still busy at shutdown; left behind (daemon)", self.rank)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _install_signal(self) -> None:
        name = self.config.on_demand_signal
        if name is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            number = getattr(signal, name)
            self._previous_handler = signal.signal(number, self._on_signal)
            self._signal_number = number
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] could not install the %s handler", self.rank, name, exc_info=True)

    def _restore_signal(self) -> None:
        if self._signal_number is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            signal.signal(self._signal_number, self._previous_handler or signal.SIG_DFL)
        except Exception:  # noqa: BLE001
            log.debug("restoring the signal handler failed", exc_info=True)
        self._signal_number = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal_requested = True  # only a flag: the watchdog thread does the work

    # ------------------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stop.wait(self.config.poll_interval_seconds):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - e.g. the store went away at the end of the job
                if self._stop.is_set():
                    return
                log.warning("[rank %d] watchdog poll failed", self.rank, exc_info=True)
                self._stop.wait(5.0)

    def _tick(self) -> None:
        with self._event_lock:
            event = self.coordinator.poll()
            if event is not None:
                self._take_part(event)
                return
            if self._signal_requested:
                self._signal_requested = False
                if self._clock() - self._last_on_demand > 5.0:
                    self._take_part(self.coordinator.propose("on_demand"))
                return
            stall = self.heartbeat.check()
            if stall is None:
                return
            self.heartbeat.mark_reported(stall.seq)
            log.warning("[rank %d] stall: no heartbeat for %.1f s in phase %s (threshold %.1f s, batch %d)",
                        self.rank, stall.seconds_since_heartbeat, stall.phase.value, stall.threshold_seconds,
                        stall.step)
            if self.stall_events >= self.config.max_dumps_per_run:
                log.warning("[rank %d] max_dumps_per_run=%d reached: not dumping", self.rank,
                            self.config.max_dumps_per_run)
                return
            self._take_part(self.coordinator.propose("stall"))

    # ------------------------------------------------------------------------------ events
    def _take_part(self, event: EventInfo, exception: str | None = None) -> CollectionResult | None:
        """Dump this rank into the event's folder; the initiator then collects and summarizes.
        Caller holds ``_event_lock``."""
        initiator = event.initiator == self.rank
        self.heartbeat.mark_reported()  # this stall is being handled: no second alarm for it
        if event.reason == "stall":
            self.stall_events += 1
        if event.reason == "on_demand":
            self._last_on_demand = self._clock()
        folder = self.dump_dir / event.name
        progress = dict(self.heartbeat.progress(), stall_events=self.stall_events)
        files = write_rank_dump(
            folder, event=event.name, reason=event.reason if initiator else "peer_request",
            initiator_rank=event.initiator, progress=progress, stack_traces=self.stack_traces,
            exception=exception if initiator else None,
        )
        log.warning("[rank %d] %s (%s, initiator rank %d): wrote %d file(s) to %s", self.rank, event.name,
                    event.reason, event.initiator, len(files), folder)
        self.events_taken_part += 1
        try:
            self.coordinator.announce_dumped(event, host_name(), files, folder, self.config.gather_through_store)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] announcing the dump through the store failed", self.rank, exc_info=True)
        try:
            gone = self.coordinator.check_local_peers(event)
            if gone:
                log.warning("[rank %d] %s: the process of rank(s) %s on this host is gone", self.rank, event.name,
                            sorted(gone))
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] checking this host's other ranks failed", self.rank, exc_info=True)
        if self.on_dumped is not None:
            try:
                self.on_dumped(event.reason)
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] recording %s in the loggers failed", self.rank, event.name, exc_info=True)
        exit_job = event.reason in ("stall", "exception") and self.config.on_stall is StallAction.dump_and_exit
        result = None
        if initiator:
            result = self._summarize(event, folder)
            try:
                self.coordinator.mark_done(event, exit_job)
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] marking %s done failed", self.rank, event.name, exc_info=True)
        elif exit_job:
            try:
                self.coordinator.wait_done(event, self.config.collect_timeout_seconds + EXIT_WAIT_MARGIN_SECONDS)
            except Exception:  # noqa: BLE001 - the store is gone: the initiator's host has exited
                log.debug("waiting for the summary failed", exc_info=True)
        if exit_job and not (initiator and event.reason == "exception"):
            self._exit_job(event)
        return result

    def _summarize(self, event: EventInfo, folder: Path) -> CollectionResult:
        result = collect_and_summarize(
            self.coordinator, event, folder,
            collect_timeout_seconds=self.config.collect_timeout_seconds,
            gather_through_store=self.config.gather_through_store,
        )
        self.results.append(result)
        if self.on_summarized is not None:
            try:
                self.on_summarized(result)
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] recording the hang kind of %s failed", self.rank, event.name, exc_info=True)
        header = (f"[rank {self.rank}] {event.name}: dumps from ranks {result.dumped_ranks}"
                  + (f", NO dump from ranks {result.missing_ranks}" if result.missing_ranks else "")
                  + (f" (process gone: ranks {result.gone_ranks})" if result.gone_ranks else "")
                  + f"; verdict {result.verdict}, culprit ranks {result.culprit_ranks}; folder {folder}")
        log.warning(header)
        if result.text:
            log.warning("\n".join(f"[rank {self.rank}] {line}" for line in result.text.splitlines()))
        return result

    def _exit_job(self, event: EventInfo) -> None:
        log.error("[rank %d] %s: on_stall=dump_and_exit, exiting with code %d", self.rank, event.name,
                  self.config.exit_code)
        self._stop.set()
        try:
            self.coordinator.leaving(event, timeout_seconds=5.0)
        except Exception:  # noqa: BLE001 - the store's host is already gone
            log.debug("announcing the exit failed", exc_info=True)
        self._exit_fn(self.config.exit_code)

    def on_exception(self, exception: BaseException) -> None:
        """Main thread, from ``on_exception``: dump this rank and ask the others; never raises."""
        text = f"{type(exception).__name__}: {exception}"
        if not self.config.dump_on_exception:
            return
        if isinstance(exception, (KeyboardInterrupt, SystemExit)):
            log.info("[rank %d] %s: no exception dump (send SIGUSR2 for an on-demand one)", self.rank, text)
            return
        if not self._event_lock.acquire(timeout=self.config.collect_timeout_seconds + 10.0):
            log.warning("[rank %d] the watchdog is busy: no exception dump", self.rank)
            return
        try:
            for _ in range(3):  # a concurrent event may take the number: join it, then ask again
                event = self.coordinator.propose("exception")
                self._take_part(event, exception=text)
                if event.initiator == self.rank:
                    break
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] the exception dump failed", self.rank, exc_info=True)
        finally:
            self._event_lock.release()


def _hard_exit(code: int) -> None:
    """The main thread is blocked in C++: ``sys.exit`` from this thread would do nothing."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)
