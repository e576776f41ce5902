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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_ncclx.dump.digest import known_members, restore_members
from lightning_ncclx.dump.native_stacks import MAX_READ_BYTES, main_thread_top
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.packing import BadValue, fetch_blob, unpack
from lightning_ncclx.events.wire import Announcement, EventMeta
from lightning_ncclx.files import atomic_write_bytes, atomic_write_text
from lightning_ncclx.layout import (
    COLLECTION_FILE, CONTEXT_SUFFIX, GATHERED_FOLDER, NATIVE_STACKS_SUFFIX, TRACE_SUFFIX, native_stacks_path, rank_file,
    rank_prefix,
)

log = logging.getLogger(__name__)

INCOMING_FOLDER = ".incoming"
"""Inside the event folder: packed dumps streamed from the store before they are unpacked."""
MAX_FULL_DUMPS_PULLED = 64


@dataclass
class CollectionResult:
    event: EventMeta
    folder: Path
    world_size: int
    dumped_ranks: list[int]
    missing_ranks: list[int]
    gone_ranks: list[int] = field(default_factory=list)
    """Missing ranks whose process a rank on the same host found exited."""
    silent_ranks: dict[int, dict] = field(default_factory=dict)
    """Missing ranks of the initiator's own host whose process is alive: ``{"pid", "host", "state"}``
    (the ``/proc`` state letter)."""
    gathered: dict[int, str] = field(default_factory=dict)
    """Rank -> folder its files were written to after being pulled through the store."""
    gather: str = "none"
    """``full`` (every dump through the store), ``two_phase`` (digests, then the culprits' full
    dumps) or ``none``."""
    digest_only_ranks: list[int] = field(default_factory=list)
    """Two-phase gather: ranks summarized from their digest (their full dump stays on their host)."""
    refused: list[str] = field(default_factory=list)
    """Store values and packed members left out, with the reason (planted, corrupt, too big)."""
    verdict: str | None = None
    culprit_ranks: list[int] = field(default_factory=list)
    hang_kind: str | None = None
    """``summary.json``'s hang kind (None when the analysis failed): pass it to
    :func:`lightning_ncclx.config.exit_code_for` for the exit status."""
    restart_advice: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, str] = field(default_factory=dict)
    text: str | None = None
    summary: Any = None
    """The analyzer's ``Summary`` (to write the reports again when the event recovers)."""
    announced: dict[int, Announcement] = field(default_factory=dict)
    blobs_from: list[int] = field(default_factory=list)
    """Ranks whose full dump this gather read from the store (their keys go at close)."""
    recovery: dict[str, Any] | None = None
    """Set once the event recovered: ``{"recovered": true, "lasted_seconds": ...}``."""


def _has_local_copy(folder: Path, rank: int, files: tuple[str, ...]) -> bool:
    prefix = rank_prefix(rank)
    names = [n for n in files if n.startswith(prefix)] or [rank_file(rank, CONTEXT_SUFFIX)]
    return all((folder / n).is_file() for n in names)


def _target(folder: Path, announcement: Announcement | None) -> Path:
    return folder / GATHERED_FOLDER / (announcement.host if announcement is not None else "unknown-host")


def _unpack_into(result: CollectionResult, source: Path | bytes, target: Path, dump_dir: Path, rank: int) -> list[Path]:
    unpacked = unpack(source, target, inside=dump_dir)
    result.refused += [f"rank {rank}'s dump: {line}" for line in unpacked.refused]
    return unpacked.written


def _pull_full(coordinator: EventCoordinator, result: CollectionResult, rank: int, dump_dir: Path) -> bool | None:
    """Rank ``rank``'s full dump from the store into ``ranks/<host>/``: True when unpacked, None
    when it is not there (yet), False when it was refused."""
    folder = result.folder
    scratch = folder / INCOMING_FOLDER
    try:
        archive = fetch_blob(coordinator.client, result.event.number, rank, scratch)
    except BadValue as error:
        result.refused.append(str(error))
        result.blobs_from.append(rank)
        return False
    if archive is None:
        return None
    result.blobs_from.append(rank)
    try:
        target = _target(folder, result.announced.get(rank))
        _unpack_into(result, archive, target, dump_dir, rank)
        result.gathered[rank] = str(target)
        return True
    except BadValue as error:
        result.refused.append(str(error))
        return False
    finally:
        archive.unlink(missing_ok=True)


def gather_missing(coordinator: EventCoordinator, result: CollectionResult, dump_dir: Path) -> None:
    """Pull the full dumps that are not in the event folder from the store."""
    for rank, announcement in sorted(result.announced.items()):
        if _has_local_copy(result.folder, rank, announcement.files):
            continue
        try:
            if _pull_full(coordinator, result, rank, dump_dir) is None:
                log.warning("[rank %d] rank %d's dump of %s is neither on this disk nor in the store",
                            coordinator.rank, rank, result.event.name)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] pulling rank %d's dump through the store failed", coordinator.rank, rank,
                        exc_info=True)


def _own_traces(folder: Path, rank: int) -> list[dict]:
    from lightning_ncclx.analysis.safe_pickle import safe_loads

    traces = []
    for path in folder.glob(f"{rank_prefix(rank)}.*.{TRACE_SUFFIX}"):
        try:
            traces.append(safe_loads(path.read_bytes()))
        except Exception:  # noqa: BLE001
            log.debug("reading %s for group members failed", path, exc_info=True)
    return traces


def _restore_digest_members(paths: list[Path], known: dict[str, str]) -> None:
    import pickle

    from lightning_ncclx.analysis.safe_pickle import safe_loads

    for path in paths:
        if not path.name.endswith(TRACE_SUFFIX):
            continue
        try:
            atomic_write_bytes(path, pickle.dumps(restore_members(safe_loads(path.read_bytes()), known)))
        except Exception:  # noqa: BLE001 - the analyzer then takes the members from other dumps
            log.warning("restoring the group members of digest %s failed", path, exc_info=True)


def gather_digests(coordinator: EventCoordinator, result: CollectionResult, dump_dir: Path) -> list[int]:
    """Two-phase gather, first phase: the digests of the dumps that are not in the event folder,
    into ``ranks/<host>/``; returns the ranks read from a digest."""
    known = known_members(_own_traces(result.folder, coordinator.rank))
    digests: list[int] = []
    for rank, announcement in sorted(result.announced.items()):
        if _has_local_copy(result.folder, rank, announcement.files) or announcement.digest is None:
            continue
        try:
            target = _target(result.folder, announcement)
            written = _unpack_into(result, announcement.digest, target, dump_dir, rank)
            _restore_digest_members(written, known)
            result.gathered[rank] = str(target)
            digests.append(rank)
        except BadValue as error:
            result.refused.append(str(error))
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] unpacking rank %d's digest failed", coordinator.rank, rank, exc_info=True)
    return digests


def _ranks_to_pull(summary: object | None, digests: list[int], peers: int) -> list[int]:
    """Of the ranks read from a digest: the smaller side of the first diagnosis (its culprits, or
    its waiting ranks where those are fewer: one rank that ran ahead leaves all others "never
    entered"), at most ``MAX_FULL_DUMPS_PULLED``, and up to ``peers`` of the other side."""
    have = set(digests)
    culprits = [int(r) for r in getattr(summary, "culprit_ranks", ()) or ()]
    waiting = [int(r) for r in getattr(summary, "waiting_ranks", ()) or ()]
    small, large = (waiting, culprits) if waiting and len(waiting) < len(culprits) else (culprits, waiting)
    chosen = [r for r in small if r in have][:MAX_FULL_DUMPS_PULLED]
    others = [r for r in dict.fromkeys(large + sorted(digests)) if r in have and r not in chosen]
    return sorted(chosen + others[:peers])


def _two_phase_gather(coordinator: EventCoordinator, result: CollectionResult, dump_dir: Path,
                      timeout_seconds: float, peers: int) -> None:
    rank = coordinator.rank
    digests = gather_digests(coordinator, result, dump_dir)
    want: list[int] = []
    if digests:
        first = _analyze(result.folder, tuple(sorted({Path(p) for p in result.gathered.values()})), rank)
        want = _ranks_to_pull(first, digests, peers)
    try:
        coordinator.request_full_dumps(result.event, want)  # also when empty: the others stop waiting for it
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] asking for the full dumps of %s failed", rank, want, exc_info=True)
        want = []
    pulled = _pull_full_dumps(coordinator, result, want, dump_dir, timeout_seconds)
    result.digest_only_ranks = [r for r in digests if r not in pulled]
    log.info("[rank %d] %s: two-phase gather: full dumps pulled from rank(s) %s, digests only from %d rank(s)",
             rank, result.event.name, pulled, len(result.digest_only_ranks))


def _pull_full_dumps(coordinator: EventCoordinator, result: CollectionResult, want: list[int], dump_dir: Path,
                     timeout_seconds: float, poll_seconds: float = 0.1) -> list[int]:
    """Wait for the wanted ranks' full dumps (up to ``timeout_seconds``), each over its digest."""
    pulled: list[int] = []
    pending = list(want)
    deadline = coordinator._clock() + timeout_seconds
    while pending:
        for r in list(pending):
            try:
                got = _pull_full(coordinator, result, r, dump_dir)
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] pulling rank %d's full dump failed", coordinator.rank, r, exc_info=True)
                got = False
            if got is None:
                continue
            if got:
                pulled.append(r)
            pending.remove(r)
        if not pending or coordinator._clock() >= deadline:
            break
        coordinator._sleep(poll_seconds)
    if pending:
        log.warning("[rank %d] %s: no full dump from rank(s) %s within %.0f s: their digests are used",
                    coordinator.rank, result.event.name, pending, timeout_seconds)
    return sorted(pulled)


def _analyze(folder: Path, extra_roots: tuple[Path, ...], rank: int) -> object | None:
    try:
        from lightning_ncclx.analysis import analyze_folder

        return analyze_folder(folder, extra_roots=extra_roots)
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] diagnosing the digests failed", rank, exc_info=True)
        return None


def run_analyzer(folder: Path, extra_roots: tuple[Path, ...], rank: int) -> tuple[Any | None, dict[str, str], str | None]:
    """Summary object, report paths and text; (None, {}, None) when the analyzer fails."""
    try:
        from lightning_ncclx.analysis import analyze_folder
    except Exception:  # noqa: BLE001
        log.error("[rank %d] the analyzer could not be imported; dumps kept in %s", rank, folder, exc_info=True)
        return None, {}, None
    try:
        summary = analyze_folder(folder, extra_roots=extra_roots)
    except Exception:  # noqa: BLE001
        log.error("[rank %d] analyzing %s failed; the dumps stay there", rank, folder, exc_info=True)
        return None, {}, None
    reports, text = write_summary_reports(summary, folder, rank)
    return summary, reports, text


def write_summary_reports(summary: Any, folder: Path, rank: int) -> tuple[dict[str, str], str | None]:
    """``summary.{json,txt,html,md}`` of ``summary`` in ``folder`` and its text; logged, never raised."""
    reports: dict[str, str] = {}
    text: str | None = None
    try:
        from lightning_ncclx.report import render_text, write_reports

        reports = {kind: str(path) for kind, path in write_reports(summary, folder).items()}
        text = render_text(summary)
    except Exception:  # noqa: BLE001
        log.error("[rank %d] writing the summary reports into %s failed", rank, folder, exc_info=True)
    return reports, text


def _wait(coordinator: EventCoordinator, event: EventMeta, timeout_seconds: float) -> dict[int, Announcement]:
    try:
        return coordinator.wait_for_dumps(event, timeout_seconds)
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
                         two_phase_peers: int = 2) -> CollectionResult:
    """Everything the initiator does after writing its own dump. Never raises."""
    rank = coordinator.rank
    result = CollectionResult(event=event, folder=folder, world_size=coordinator.world_size, dumped_ranks=[rank],
                              missing_ranks=[r for r in range(coordinator.world_size) if r != rank])
    try:
        _collect(coordinator, result, dump_dir, collect_timeout_seconds, gather_through_store, two_phase,
                 two_phase_peers)
    except Exception:  # noqa: BLE001 - summarize whatever arrived
        log.error("[rank %d] gathering the dumps of %s failed; summarizing what is here", rank, event.name,
                  exc_info=True)
    finally:
        shutil.rmtree(folder / INCOMING_FOLDER, ignore_errors=True)
    result.refused = coordinator.refused[:] + result.refused
    _write_collection(result)
    extra_roots = tuple(sorted({Path(p) for p in result.gathered.values()}))
    summary, result.reports, result.text = run_analyzer(folder, extra_roots, rank)
    if summary is not None:
        result.summary = summary
        result.verdict = str(getattr(summary, "verdict", None))
        result.culprit_ranks = [int(r) for r in getattr(summary, "culprit_ranks", ()) or ()]
        try:
            result.hang_kind = summary.classification.kind.value
            result.restart_advice = summary.classification.restart_advice()
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] classifying the hang failed", rank, exc_info=True)
        _write_collection(result)
    return result


def _collect(coordinator: EventCoordinator, result: CollectionResult, dump_dir: Path, timeout_seconds: float,
             gather_through_store: bool, two_phase: bool, two_phase_peers: int) -> None:
    rank, event = coordinator.rank, result.event
    result.announced = _wait(coordinator, event, timeout_seconds)
    result.announced.setdefault(rank, Announcement(rank, "unknown-host", (), str(result.folder)))
    result.dumped_ranks = sorted(result.announced)
    result.missing_ranks = [r for r in range(coordinator.world_size) if r not in result.announced]
    if result.missing_ranks:
        _liveness(coordinator, result)
    if gather_through_store and two_phase:
        result.gather = "two_phase"
        _two_phase_gather(coordinator, result, dump_dir, timeout_seconds, two_phase_peers)
    elif gather_through_store:
        result.gather = "full"
        gather_missing(coordinator, result, dump_dir)
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


def collection_document(result: CollectionResult) -> dict[str, Any]:
    data = {
        "schema": "lightning-ncclx/collection/1",
        "event": result.event.name,
        "reason": result.event.reason,
        "initiator_rank": result.event.initiator,
        "world_size": result.world_size,
        "dumped_ranks": result.dumped_ranks,
        "missing_ranks": result.missing_ranks,
        "gone_ranks": result.gone_ranks,
        "silent_ranks": {str(r): v for r, v in result.silent_ranks.items()},
        "gathered": {str(k): v for k, v in result.gathered.items()},
        "gather": result.gather,
        "digest_only_ranks": result.digest_only_ranks,
        "refused": result.refused[:200],
        "verdict": result.verdict,
        "culprit_ranks": result.culprit_ranks,
        "hang_kind": result.hang_kind,
        "restart_advice": result.restart_advice,
    }
    if result.recovery is not None:
        data["recovery"] = result.recovery
    return data


def _write_collection(result: CollectionResult) -> None:
    try:
        atomic_write_text(result.folder / COLLECTION_FILE, json.dumps(collection_document(result), indent=2))
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] writing %s failed", result.event.initiator, COLLECTION_FILE, exc_info=True)


def record_recovery(result: CollectionResult, recovery: dict[str, Any]) -> None:
    """The event recovered: ``collection.json`` and the summary reports say so (the analyzer
    reads the recovery from ``collection.json``, so an offline ``summarize`` says it too)."""
    result.recovery = recovery
    _write_collection(result)
    if result.summary is None:
        return
    try:
        from lightning_ncclx.analysis import analyze_folder

        summary = analyze_folder(result.folder, extra_roots=tuple(sorted({Path(p) for p in result.gathered.values()})))
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] re-reading %s after its recovery failed", result.event.initiator, result.folder,
                    exc_info=True)
        return
    result.summary = summary
    result.reports, result.text = write_summary_reports(summary, result.folder, result.event.initiator)


__all__ = ["CollectionResult", "gather_and_summarize", "record_recovery", "BadValue"]
