"""The initiator's side of an event: wait for every rank's dump, pull the ones that are not on
this disk through the store, run the analyzer and write ``summary.{json,txt,html}``.

Everything read from the store is checked (:mod:`wire`, :mod:`packing`): a bad announcement,
digest or dump costs only that rank's entry, listed with the reason in ``collection.json``
(``refused``). :func:`gather_and_summarize` never raises.

The analyzer (``lightning_ncclx.analysis``) and the reports (``lightning_ncclx.report``) are
imported lazily and guarded: when they fail, the failure is logged with its traceback and the
dumps stay where they are for ``lightning-ncclx summarize`` to read later.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightning_ncclx.dump.native_stacks import MAX_READ_BYTES, fatal_signal, main_thread_top
from lightning_ncclx.errors import DumpReadError
from lightning_ncclx.events.collection import CollectionResult, collection_document, write_collection
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.liveness import describe_wait_status
from lightning_ncclx.events.pull import INCOMING_FOLDER, has_local_copy, names_in, pull_full
from lightning_ncclx.events.two_phase import finish_digest_files, two_phase_gather
from lightning_ncclx.events.wire import Announcement, BadValue, EventMeta
from lightning_ncclx.files import atomic_write_bytes
from lightning_ncclx.layout import CONTEXT_SUFFIX, NATIVE_STACKS_SUFFIX, native_stacks_path, rank_file

log = logging.getLogger(__name__)


def gather_missing(coordinator: EventCoordinator, result: CollectionResult, dump_dir: Path) -> None:
    """Pull the full dumps that are not in the event folder from the store."""
    present = names_in(result.folder)
    for rank, announcement in sorted(result.announced.items()):
        if has_local_copy(present, rank, announcement.files):
            continue
        try:
            if pull_full(coordinator, result, rank, dump_dir) is None:
                log.warning("[rank %d] rank %d's dump of %s is neither on this disk nor in the store",
                            coordinator.rank, rank, result.event.name)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] pulling rank %d's dump through the store failed", coordinator.rank, rank,
                        exc_info=True)


def run_analyzer(folder: Path, extra_roots: tuple[Path, ...], rank: int,
                 loaded: Any = None) -> tuple[Any | None, dict[str, str], str | None]:
    """Summary object, report paths and text; (None, {}, None) when the analyzer fails.
    ``loaded``: the folder as already read (a two-phase gather's); None reads it."""
    summary = analyze_loaded(folder, extra_roots, rank, loaded)
    if summary is None:
        return None, {}, None
    reports, text = write_summary_reports(summary, folder, rank)
    return summary, reports, text


def analyze_loaded(folder: Path, extra_roots: tuple[Path, ...], rank: int, loaded: Any = None) -> Any | None:
    """The analyzer's summary of the event (``loaded``: as already read; None reads ``folder``),
    no report written; None when the analyzer fails (logged)."""
    try:
        from lightning_ncclx.analysis import analyze, analyze_folder
    except Exception:  # noqa: BLE001
        log.error("[rank %d] the analyzer could not be imported; dumps kept in %s", rank, folder, exc_info=True)
        return None
    try:
        return analyze(loaded) if loaded is not None else analyze_folder(folder, extra_roots=extra_roots)
    except DumpReadError as error:  # the event folder could not be made: said once, without a traceback
        log.error("[rank %d] nothing to summarize: %s", rank, error)
    except Exception:  # noqa: BLE001
        log.error("[rank %d] analyzing %s failed; the dumps stay there", rank, folder, exc_info=True)
    return None


def write_summary_reports(summary: Any, folder: Path, rank: int) -> tuple[dict[str, str], str | None]:
    """``summary.{json,txt,html,md}`` of ``summary`` in ``folder`` and its text; logged, never raised."""
    reports = write_first_answer(summary, folder, rank)
    rest, text = write_other_reports(summary, folder, rank)
    return {**reports, **rest}, text


def write_first_answer(summary: Any, folder: Path, rank: int) -> dict[str, str]:
    """``summary.json`` (the kind, culprits, headline, advice); logged, never raised."""
    try:
        from lightning_ncclx.report import write_first

        return {"json": str(write_first(summary, folder))}
    except Exception:  # noqa: BLE001
        log.error("[rank %d] writing summary.json into %s failed", rank, folder, exc_info=True)
        return {}


def write_other_reports(summary: Any, folder: Path, rank: int) -> tuple[dict[str, str], str | None]:
    """The reports after ``summary.json`` and the summary's text; logged, never raised."""
    reports: dict[str, str] = {}
    text: str | None = None
    try:
        from lightning_ncclx.report import render_text, write_rest

        text = render_text(summary)
        reports = {kind: str(path) for kind, path in write_rest(summary, folder, text).items()}
    except Exception:  # noqa: BLE001
        log.error("[rank %d] writing the summary reports into %s failed", rank, folder, exc_info=True)
    return reports, text


class ReportsWriter:
    """The reports after ``summary.json`` and the expanded digests' files, written by a thread
    of their own once the first answer is on disk, so that neither holds up the event's close,
    its outcome or the exit agreement. A plain (non-daemon) thread: an interpreter that ends
    normally waits for it; a process that ends with ``os._exit`` calls :func:`wait_for_reports`
    first. When done, the summary's text is logged as the summarizing rank's answer."""

    def __init__(self, result: CollectionResult, summary: Any) -> None:
        self.result, self.summary = result, summary
        self.reports: dict[str, str] = {}
        self.text: str | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="ncclx-reports")
        with _PENDING_LOCK:
            _PENDING.add(self)
        self._thread.start()

    def _run(self) -> None:
        result, rank = self.result, self.result.event.initiator
        started = time.monotonic()
        try:
            if self.summary is not None:
                self.reports, self.text = write_other_reports(self.summary, result.folder, rank)
                if self.text:
                    log.warning("\n".join(f"[rank {rank}] {line}" for line in self.text.splitlines()))
            finish_digest_files(result)
            shutil.rmtree(result.folder / INCOMING_FOLDER, ignore_errors=True)
        except Exception:  # noqa: BLE001 - never raised into the watchdog
            log.error("[rank %d] writing the reports of %s failed", rank, result.event.name, exc_info=True)
        finally:
            self.seconds = time.monotonic() - started
            with _PENDING_LOCK:
                _PENDING.discard(self)

    def join(self, timeout_seconds: float | None = None) -> bool:
        """Wait for the thread (at most ``timeout_seconds``); True once it is done."""
        self._thread.join(timeout_seconds)
        return not self._thread.is_alive()


_PENDING: set[ReportsWriter] = set()
_PENDING_LOCK = threading.Lock()
REPORTS_WAIT_SECONDS = 120.0
"""How long a process about to end waits for its event's reports (:func:`wait_for_reports`)."""


def finish_reports(result: CollectionResult, timeout_seconds: float | None = None) -> None:
    """Wait for ``result``'s reports after ``summary.json`` (see :class:`ReportsWriter`); then
    ``result.reports`` names every report and ``result.text`` holds the summary's text."""
    writer = result.reports_writer
    if writer is None or not writer.join(timeout_seconds):
        return
    result.reports_writer = None
    result.reports = {**result.reports, **writer.reports}
    result.text = writer.text if writer.text is not None else result.text
    result.timings["reports"] = writer.seconds


def wait_for_reports(timeout_seconds: float = REPORTS_WAIT_SECONDS) -> None:
    """Before this process ends: wait for every event's reports still being written (at most
    ``timeout_seconds`` in all). Never raises."""
    deadline = time.monotonic() + timeout_seconds
    with _PENDING_LOCK:
        pending = list(_PENDING)
    for writer in pending:
        if not writer.join(max(0.0, deadline - time.monotonic())):
            log.warning("the reports of %s are still being written after %.0f s; ending without them",
                        writer.result.event.name, timeout_seconds)
            return


def _wait(coordinator: EventCoordinator, event: EventMeta, timeout_seconds: float,
          silent_ranks: frozenset[int] = frozenset()) -> dict[int, Announcement]:
    try:
        return coordinator.wait_for_dumps(event, timeout_seconds, silent_ranks=silent_ranks)
    except Exception:  # noqa: BLE001 - the store may be gone (rank 0 died): summarize what is here
        log.warning("[rank %d] waiting for the other ranks' dumps failed", coordinator.rank, exc_info=True)
        return {}


def _liveness(coordinator: EventCoordinator, result: CollectionResult) -> None:
    try:
        gone = coordinator.gone_ranks(result.event)
    except Exception:  # noqa: BLE001
        gone = set()
    result.gone_ranks = sorted(gone & set(result.missing_ranks))
    try:
        silent = coordinator.silent_local_ranks([r for r in result.missing_ranks if r not in gone])
    except Exception:  # noqa: BLE001
        silent = {}
    result.silent_ranks = {r: {"pid": info.pid, "host": info.host, "state": state}
                           for r, (info, state) in sorted(silent.items())}
    for r, proc in result.silent_ranks.items():
        proc.update(_native_stacks_of(result.folder, r))


def gather_and_summarize(coordinator: EventCoordinator, event: EventMeta, folder: Path, *, dump_dir: Path,
                         collect_timeout_seconds: float, gather_through_store: bool, two_phase: bool = False,
                         two_phase_peers: int = 2, silent_ranks: frozenset[int] = frozenset()) -> CollectionResult:
    """Everything the initiator does after writing its own dump. Never raises. ``silent_ranks``:
    ranks the detection found unable to run their watchdog (waited for only briefly)."""
    rank = coordinator.rank
    result = CollectionResult(event=event, folder=folder, world_size=coordinator.world_size, dumped_ranks=[rank],
                              missing_ranks=[r for r in range(coordinator.world_size) if r != rank])
    coordinator.refused.clear()  # this event's refusals only: an earlier event's planted text is no headline here
    try:
        _collect(coordinator, result, dump_dir, collect_timeout_seconds, gather_through_store, two_phase,
                 two_phase_peers, silent_ranks)
    except Exception:  # noqa: BLE001 - summarize whatever arrived
        log.error("[rank %d] gathering the dumps of %s failed; summarizing what is here", rank, event.name,
                  exc_info=True)
    result.refused = coordinator.refused[:] + result.refused
    summary = None
    try:
        write_collection(result)
        extra_roots = tuple(sorted({Path(p) for p in result.gathered.values()}))
        started = time.monotonic()
        loaded = _read_in_memory(result)
        if loaded is None:  # the summary reads every file: they must be in place
            finish_digest_files(result)
            shutil.rmtree(folder / INCOMING_FOLDER, ignore_errors=True)
        summary = analyze_loaded(folder, extra_roots, rank, loaded)
        del loaded
        if summary is not None:
            result.reports = write_first_answer(summary, folder, rank)
        result.timings["summary"] = time.monotonic() - started
    finally:
        result.in_memory = None
        # the other reports and the digests' files (the summary did not need them): after summary.json
        result.reports_writer = ReportsWriter(result, summary)
    if summary is not None:
        result.summary = summary
        # with no dump read there is nothing to judge: no verdict (the analyzer's "no_hang" would mislead)
        result.verdict = str(getattr(summary, "verdict", None)) if getattr(summary, "inputs", ()) else None
        result.culprit_ranks = [int(r) for r in getattr(summary, "culprit_ranks", ()) or ()]
        try:
            result.hang_kind = summary.classification.kind.value
            result.restart_advice = summary.classification.restart_advice()
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] classifying the hang failed", rank, exc_info=True)
        write_collection(result)
    return result


def _read_in_memory(result: CollectionResult) -> Any:
    """A two-phase gather's event folder, its expanded digests not read back from disk (None:
    read the whole folder)."""
    if result.in_memory is None:
        return None
    digest_only = set(result.digest_only_ranks)
    read_folders = sorted({Path(p) for r, p in result.gathered.items() if r not in digest_only})
    try:
        return result.in_memory.final_loaded(result.digest_only_ranks, read_folders)
    except Exception:  # noqa: BLE001 - then the whole folder is read
        log.warning("[rank %d] summarizing %s from memory failed; reading its files", result.event.initiator,
                    result.folder, exc_info=True)
        return None


def _collect(coordinator: EventCoordinator, result: CollectionResult, dump_dir: Path, timeout_seconds: float,
             gather_through_store: bool, two_phase: bool, two_phase_peers: int,
             silent_ranks: frozenset[int] = frozenset()) -> None:
    rank, event = coordinator.rank, result.event
    started = time.monotonic()
    result.announced = _wait(coordinator, event, timeout_seconds, silent_ranks)
    result.timings["wait"] = time.monotonic() - started
    result.announced.setdefault(rank, Announcement(rank, "unknown-host", (), str(result.folder)))
    result.dumped_ranks = sorted(result.announced)
    result.missing_ranks = [r for r in range(coordinator.world_size) if r not in result.announced]
    if result.missing_ranks:
        _liveness(coordinator, result)
    if gather_through_store and two_phase:
        result.gather = "two_phase"
        two_phase_gather(coordinator, result, dump_dir, timeout_seconds, two_phase_peers)
    elif gather_through_store:
        result.gather = "full"
        gather_missing(coordinator, result, dump_dir)
    if result.gone_ranks:
        _gone_exits(coordinator, result)
    waited_for = [r for r in result.missing_ranks if r not in result.gone_ranks]
    for r, proc in result.silent_ranks.items():
        log.warning("[rank %d] %s: rank %d (pid %d, state %s) is alive on this host but did not dump%s", rank,
                    event.name, r, proc["pid"], proc["state"],
                    f"; its main thread (native stack dump) is at {proc['main_thread']}" if proc.get("main_thread") else "")
    if result.gone_ranks:
        log.warning("[rank %d] %s: the process of rank(s) %s had exited: no dump from them", rank, event.name,
                    result.gone_ranks)
    if waited_for:
        log.warning("[rank %d] %s: no dump from rank(s) %s within %.0f s", rank, event.name,
                    waited_for, timeout_seconds)


MAX_PEERS_SAW = 8
MAX_CONTEXT_BYTES = 1 << 20
_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "read error", "write error")


def _gone_exits(coordinator: EventCoordinator, result: CollectionResult) -> None:
    """How each gone rank's process ended, where this rank can know it: its wait status, read on
    this host while it was a zombie, or the fatal signal its faulthandler recorded in the run's
    dump folder (this host's, or a shared one); else unknown (only its parent, the launcher, saw
    it), with what the ranks that dumped saw of it. Never raises."""
    now = round(time.time(), 3)
    try:
        statuses = dict(coordinator.local.exits)
    except Exception:  # noqa: BLE001
        statuses = {}
    saw: dict[str, str] | None = None
    for r in result.gone_ranks:
        entry: dict[str, Any] = {"signal": None, "status": None, "known_from": None, "found_gone_unix": now}
        if r in statuses:
            entry.update(describe_wait_status(statuses[r]), known_from=(
                f"its wait status, read from /proc by rank {coordinator.rank} on the same host before its parent "
                "reaped it"))
        else:
            source = native_stacks_path(result.folder.parent, r)
            name = fatal_signal(source)
            if name is not None:
                entry.update(signal=name, status=128 + int(signal.Signals[name]),
                             known_from=f"its faulthandler record of a fatal signal ({source.name})")
        if entry["known_from"] is None:
            saw = _peers_saw(result) if saw is None else saw
            entry["peers_saw"] = saw
            entry["unknown"] = ("its exit status is known only to its parent (the launcher: torchrun's or srun's "
                                "log, `sacct`); the ranks that dumped saw what peers_saw says")
        native = _native_stacks_of(result.folder, r)
        if native:
            entry.update(native)
        result.gone_exits[r] = entry


def _peers_saw(result: CollectionResult) -> dict[str, str]:
    """The exceptions of (at most ``MAX_PEERS_SAW``) ranks that dumped and lost a peer."""
    saw: dict[str, str] = {}
    for r in result.dumped_ranks:
        if len(saw) >= MAX_PEERS_SAW:
            break
        folder = Path(result.gathered.get(r, result.folder))
        try:
            with open(folder / rank_file(r, CONTEXT_SUFFIX), "rb") as handle:
                text = json.loads(handle.read(MAX_CONTEXT_BYTES)).get("exception")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(text, str) and any(w in text.lower() for w in _PEER_LOST):
            saw[str(r)] = text.splitlines()[0][:300]
    return saw


def _native_stacks_of(folder: Path, rank: int) -> dict[str, str]:
    """A silent rank's faulthandler stack dump (written when its watchdog thread starved), copied
    into the event folder; ``{"native_stacks": file name, "main_thread": "file:line in fn"}``."""
    source = native_stacks_path(folder.parent, rank)
    top = main_thread_top(source)
    if top is None:
        return {}
    target = folder / rank_file(rank, NATIVE_STACKS_SUFFIX)
    try:
        with open(source, "rb") as handle:
            atomic_write_bytes(target, handle.read(MAX_READ_BYTES))
    except OSError:
        log.warning("copying %s failed", source, exc_info=True)
        return {"main_thread": top}
    return {"native_stacks": target.name, "main_thread": top}


def record_recovery(result: CollectionResult, recovery: dict[str, Any]) -> None:
    """The event recovered: ``collection.json`` and the summary reports say so, written again
    from the summary in memory (no second analysis). The analyzer reads the recovery from
    ``collection.json``, so an offline ``summarize`` of the folder says it too."""
    finish_reports(result)  # the reports below replace them: not while they are still being written
    result.recovery = recovery
    write_collection(result)
    if result.summary is None:
        return
    from lightning_ncclx.analysis.collection_file import recovery_from

    summary = replace(result.summary, recovery=recovery_from(recovery))
    result.summary = summary
    result.reports, result.text = write_summary_reports(summary, result.folder, result.event.initiator)


__all__ = ["Announcement", "BadValue", "CollectionResult", "ReportsWriter", "collection_document", "finish_reports",
           "gather_and_summarize", "gather_missing", "record_recovery", "wait_for_reports"]
