"""Rank 0, the initiator, for ``bench_event_scale.py``: what ``EventParticipation.take_part``,
``_close``, ``_decide`` and ``WatchdogRuntime.leave`` do on the rank that starts a stall event
with ``dump_and_exit``, through the real ``events`` code (``run_new``); and the same steps of the
protocol before it (``run_old``, see ``scale_old.py``)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import scale_job
from scale_ranks import CountingStore, Counts, bench_config, process_info

from lightning_ncclx.config import exit_code_for
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.doorbell import Doorbell
from lightning_ncclx.events.gather import gather_and_summarize

try:
    from lightning_ncclx.events.gather import finish_reports
except ImportError:  # a baseline from before the reports' own thread
    finish_reports = None
from lightning_ncclx.events.wire import Announcement, Outcome
from lightning_ncclx.watchdog.participation import EXIT_WAIT_MARGIN_SECONDS, scaled
from lightning_ncclx.watchdog.runtime import LEAVE_WAIT_SECONDS

LOCAL_STEPS = ("digests", "first_diagnosis", "digest_files", "summary", "reports")
"""The initiator's own work between store requests (timed in ``collection.json``)."""


def run_new(port: int, world: int, counts: Counts, dump_dir: Path, steps: int, mark: Any, cap: float) -> dict:
    config = bench_config()
    address = StoreAddress("127.0.0.1", port)

    def opener() -> CountingStore:
        return CountingStore(address.connect(), counts)

    client = StoreClient(opener=opener, op_timeout_seconds=config.poll_interval_seconds)
    coordinator = EventCoordinator(client, 0, world, stale_after_seconds=scaled(
        config.collect_timeout_seconds + 2 * EXIT_WAIT_MARGIN_SECONDS, world))
    coordinator.rings_doorbells = True
    coordinator.name_taken = lambda name: (dump_dir / name).exists()
    doorbell = Doorbell(opener, client, 0, on_ring=lambda: None)
    doorbell.start()
    coordinator.skip_past_events()
    coordinator.register_process(process_info(0))
    while not doorbell.listening:
        time.sleep(0.01)
    mark.times[:] = [("start", time.time())]
    event = coordinator.propose("stall")
    assert event is not None and event.initiator == 0
    mark("ring")
    folder = dump_dir / event.name
    folder.mkdir(parents=True)
    files = scale_job.write_rank(folder, 0, world, steps, event.name)
    coordinator.announce(event, Announcement(0, scale_job.host_of(0), tuple(p.name for p in files), str(folder)))
    coordinator.check_local_peers(event)
    gathered_at = time.time()
    result = gather_and_summarize(coordinator, event, folder, dump_dir=dump_dir,
                                  collect_timeout_seconds=scaled(config.collect_timeout_seconds, world),
                                  gather_through_store=True, two_phase=True,
                                  two_phase_peers=config.two_phase_gather_peers)
    _split(mark, gathered_at, result.timings)
    coordinator.close(event, result.announced, result.blobs_from)
    mark("close")
    code = exit_code_for(result.hang_kind, config)
    coordinator.set_outcome(event, Outcome(exit=True, code=code, kind=result.hang_kind, advice=result.restart_advice))
    coordinator.launcher_parent()
    coordinator.leaving(event, timeout_seconds=scaled(LEAVE_WAIT_SECONDS, world))
    left = len(coordinator.roster(event, "leaving"))
    coordinator.forget(event)
    mark("outcome_exit")
    if finish_reports is not None:  # the reports after summary.json, on their own thread: joined before exit
        finish_reports(result)
        mark("reports")
    doorbell.stop()
    summary = result.summary
    return {"initiator_code": code, "kind": result.hang_kind, "verdict": result.verdict,
            "culprits": result.culprit_ranks[:8], "want": sorted(set(result.blobs_from)),
            "digest_only": len(result.digest_only_ranks), "refused": result.refused[:3], "left": left,
            "all_left": left >= world, "local_work": {k: result.timings.get(k, 0.0) for k in LOCAL_STEPS},
            "summary_files": {name: (folder / name).stat().st_size for name in ("summary.json", "summary.html")
                              if (folder / name).exists()},
            "headline": getattr(summary, "headline", None)}


def _split(mark: Any, start: float, timings: dict[str, float]) -> None:
    """The collection's steps as phases (their seconds from the gather's timings), ending now
    (the expanded digests' files are finished after summary.json is written: here, or since the
    reports' own thread, after the outcome, in the ``reports`` phase)."""
    at = start
    for name, label in (("wait", "announce"), ("digests", "digests"), ("first_diagnosis", "first_diagnosis"),
                        ("full_dumps", "want_full_dumps"), ("summary", "summary")):
        at += timings.get(name, 0.0)
        mark.times.append((label, at))
    mark("digest_files")


def run_old(port: int, world: int, counts: Counts, mark: Any, local: dict[str, Any], cap: float) -> dict:
    from scale_old import OldInitiator

    import torch.distributed as dist

    def connect() -> CountingStore:
        raw = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
        return CountingStore(dist.PrefixStore("lightning_ncclx", raw), counts)

    store, listen = connect(), connect()
    info = process_info(0)
    store.append(f"procs/{info.scope}", info.to_json() + "\n")
    bell = threading.Thread(target=_old_bell, args=(listen,), daemon=True)
    bell.start()
    time.sleep(0.5)
    old = OldInitiator(store, world, info.scope, mark)
    mark.times[:] = [("start", time.time())]
    deadline = time.time() + cap
    monotonic_deadline = time.monotonic() + cap
    old.start()
    mark("ring")
    old.collect(monotonic_deadline, local.get("digests", 0.0))
    _wait(local.get("first_diagnosis", 0.0), deadline)
    mark("first_diagnosis")
    _wait(local.get("digest_files", 0.0), deadline)
    mark("digest_files")
    old.want(list(local.get("want", [])), monotonic_deadline)
    mark("want_full_dumps")
    _wait(local.get("summary", 0.0), deadline)
    mark("summary")
    old.close(monotonic_deadline)
    mark("close")
    code = int(local.get("code", 75))
    if time.time() < deadline:
        old.done(code, local.get("kind"))
        old.leave(monotonic_deadline)
    mark("outcome_exit")
    left = int(store.add("ev/1/leaving", 0))
    return {"initiator_code": code, "left": left, "all_left": left >= world, "capped": time.time() >= deadline}


def _old_bell(listen: Any) -> None:
    listen.wait(["bell/0"], timedelta(seconds=600))
    listen.get("bell/0")
    listen.delete_key("bell/0")


def _wait(seconds: float, deadline: float) -> None:
    time.sleep(max(0.0, min(seconds, deadline - time.time())))


__all__ = ["run_new", "run_old"]
