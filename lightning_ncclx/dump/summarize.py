"""The initiator's side of an event: wait for every rank's dump, pull the ones that are not on
this disk through the store, run the analyzer and write ``summary.{json,txt,html}``.

The analyzer (``lightning_ncclx.analysis``) and the reports (``lightning_ncclx.report``) are
imported lazily and guarded: when they fail, the failure is logged with its traceback and the
dumps stay where they are for ``lightning-ncclx summarize`` to read later.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.dump.coordinator import EventCoordinator, EventInfo, unpack_files
from lightning_ncclx.dump.digest import known_members, restore_members
from lightning_ncclx.dump.native_stacks import MAX_READ_BYTES, main_thread_top
from lightning_ncclx.files import atomic_write_bytes, atomic_write_text
from lightning_ncclx.layout import (
    COLLECTION_FILE, CONTEXT_SUFFIX, GATHERED_FOLDER, NATIVE_STACKS_SUFFIX, TRACE_SUFFIX, native_stacks_path, rank_file,
    rank_prefix,
)

log = logging.getLogger(__name__)



@dataclass
class CollectionResult:
    event: EventInfo
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
    verdict: str | None = None
    culprit_ranks: list[int] = field(default_factory=list)
    hang_kind: str | None = None
    """``summary.json``'s hang kind (None when the analysis failed): pass it to
    :func:`lightning_ncclx.config.exit_code_for` for the exit status."""
    restart_advice: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, str] = field(default_factory=dict)
    text: str | None = None


def _has_local_copy(folder: Path, rank: int, files: list[str]) -> bool:
    prefix = rank_prefix(rank)
    names = [n for n in files if n.startswith(prefix)] or [rank_file(rank, CONTEXT_SUFFIX)]
    return all((folder / n).is_file() for n in names)


def _pull_through_store(coordinator: EventCoordinator, event: EventInfo, folder: Path, announced: dict[int, dict],
                        fetch: Callable[[EventInfo, int], bytes | None], what: str,
                        written: Callable[[list[Path]], None] = lambda paths: None) -> dict[int, str]:
    """Unpack ``fetch(event, rank)`` of every announced rank without a copy in ``folder`` into
    ``folder/ranks/<host>/``; returns rank -> that folder."""
    gathered: dict[int, str] = {}
    for rank, meta in sorted(announced.items()):
        if _has_local_copy(folder, rank, list(meta.get("files", []))):
            continue
        try:
            blob = fetch(event, rank)
            if blob is None:
                log.warning("[rank %d] rank %d's %s of %s is neither on this disk nor in the store",
                            coordinator.rank, rank, what, event.name)
                continue
            target = folder / GATHERED_FOLDER / _host_folder(meta)
            written(unpack_files(blob, target))
            gathered[rank] = str(target)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] pulling rank %d's %s through the store failed", coordinator.rank, rank, what,
                        exc_info=True)
    return gathered


def gather_missing(coordinator: EventCoordinator, event: EventInfo, folder: Path,
                   announced: dict[int, dict]) -> dict[int, str]:
    """Pull the dumps that are not in ``folder`` from the store into ``folder/ranks/<host>/``."""
    return _pull_through_store(coordinator, event, folder, announced, coordinator.fetch_blob, "dump")


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


def gather_digests(coordinator: EventCoordinator, event: EventInfo, folder: Path,
                   announced: dict[int, dict]) -> tuple[dict[int, str], list[int]]:
    """Two-phase gather, first phase: the digests of the dumps that are not in ``folder``, into
    ``folder/ranks/<host>/``; returns (rank -> folder, ranks read from a digest)."""
    known = known_members(_own_traces(folder, coordinator.rank))
    gathered = _pull_through_store(coordinator, event, folder, announced, coordinator.fetch_digest, "digest",
                                   lambda paths: _restore_digest_members(paths, known))
    return gathered, sorted(gathered)


def _host_folder(meta: dict) -> str:
    return str(meta.get("host") or "unknown-host").replace("/", "_") or "unknown-host"


MAX_FULL_DUMPS_PULLED = 64


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


def _two_phase_gather(coordinator: EventCoordinator, event: EventInfo, folder: Path, announced: dict[int, dict],
                      result: CollectionResult, timeout_seconds: float, peers: int) -> None:
    rank = coordinator.rank
    result.gathered, digests = gather_digests(coordinator, event, folder, announced)
    want: list[int] = []
    if digests:
        first = _first_diagnosis(folder, tuple(sorted({Path(p) for p in result.gathered.values()})), rank)
        want = _ranks_to_pull(first, digests, peers)
    try:
        coordinator.request_full_dumps(event, want)  # also when empty: the others stop waiting for it
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] asking for the full dumps of %s failed", rank, want, exc_info=True)
        want = []
    pulled = _pull_full_dumps(coordinator, event, folder, announced, want, timeout_seconds)
    result.digest_only_ranks = [r for r in digests if r not in pulled]
    log.info("[rank %d] %s: two-phase gather: full dumps pulled from rank(s) %s, digests only from %d rank(s)",
             rank, event.name, pulled, len(result.digest_only_ranks))


def _first_diagnosis(folder: Path, extra_roots: tuple[Path, ...], rank: int) -> object | None:
    try:
        from lightning_ncclx.analysis import analyze_folder

        return analyze_folder(folder, extra_roots=extra_roots)
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] diagnosing the digests failed", rank, exc_info=True)
        return None


def _pull_full_dumps(coordinator: EventCoordinator, event: EventInfo, folder: Path, announced: dict[int, dict],
                     want: list[int], timeout_seconds: float, poll_seconds: float = 0.1) -> list[int]:
    """Wait for the wanted ranks' full dumps (up to ``timeout_seconds``) and write each over its digest."""
    pulled: list[int] = []
    pending = list(want)
    deadline = coordinator._clock() + timeout_seconds
    while pending:
        for r in list(pending):
            try:
                blob = coordinator.fetch_blob(event, r)
                if blob is None:
                    continue
                unpack_files(blob, folder / GATHERED_FOLDER / _host_folder(announced.get(r, {})))
                pulled.append(r)
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] pulling rank %d's full dump failed", coordinator.rank, r, exc_info=True)
            pending.remove(r)
        if not pending or coordinator._clock() >= deadline:
            break
        coordinator._sleep(poll_seconds)
    if pending:
        log.warning("[rank %d] %s: no full dump from rank(s) %s within %.0f s: their digests are used",
                    coordinator.rank, event.name, pending, timeout_seconds)
    return sorted(pulled)


def run_analyzer(folder: Path, extra_roots: tuple[Path, ...], rank: int) -> tuple[Any | None, dict[str, str], str | None]:
    """Summary object, report paths and text; (None, {}, None) when the analyzer fails."""
    try:
        from lightning_ncclx.analysis import analyze_folder
        from lightning_ncclx.report import render_text, write_reports
    except Exception:  # noqa: BLE001
        log.error("[rank %d] the analyzer could not be imported; dumps kept in %s", rank, folder, exc_info=True)
        return None, {}, None
    try:
        summary = analyze_folder(folder, extra_roots=extra_roots)
    except Exception:  # noqa: BLE001
        log.error("[rank %d] analyzing %s failed; the dumps stay there", rank, folder, exc_info=True)
        return None, {}, None
    reports: dict[str, str] = {}
    text: str | None = None
    try:
        reports = {kind: str(path) for kind, path in write_reports(summary, folder).items()}
    except Exception:  # noqa: BLE001
        log.error("[rank %d] writing the summary reports into %s failed", rank, folder, exc_info=True)
    try:
        text = render_text(summary)
    except Exception:  # noqa: BLE001
        log.error("[rank %d] rendering the summary failed", rank, exc_info=True)
    return summary, reports, text


def collect_and_summarize(coordinator: EventCoordinator, event: EventInfo, folder: Path, *,
                          collect_timeout_seconds: float, gather_through_store: bool, two_phase: bool = False,
                          two_phase_peers: int = 2) -> CollectionResult:
    """Everything the initiator does after writing its own dump. Never raises."""
    rank = coordinator.rank
    try:
        announced = coordinator.wait_for_dumps(event, collect_timeout_seconds)
    except Exception:  # noqa: BLE001 - the store may be gone (rank 0 died): summarize what is here
        log.warning("[rank %d] waiting for the other ranks' dumps failed", rank, exc_info=True)
        announced = {rank: {"files": []}}
    result = CollectionResult(
        event=event, folder=folder, world_size=coordinator.world_size,
        dumped_ranks=sorted(announced),
        missing_ranks=[r for r in range(coordinator.world_size) if r not in announced],
    )
    if result.missing_ranks:
        try:
            gone = coordinator.gone_ranks(event)
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
            proc.update(_native_stacks_of(folder, r))
    if gather_through_store and two_phase:
        result.gather = "two_phase"
        _two_phase_gather(coordinator, event, folder, announced, result, collect_timeout_seconds, two_phase_peers)
    elif gather_through_store:
        result.gather = "full"
        result.gathered = gather_missing(coordinator, event, folder, announced)
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
                    waited_for, collect_timeout_seconds)
    _write_collection(result)
    extra_roots = tuple(sorted({Path(p) for p in result.gathered.values()}))
    summary, result.reports, result.text = run_analyzer(folder, extra_roots, rank)
    if summary is not None:
        result.verdict = str(getattr(summary, "verdict", None))
        result.culprit_ranks = [int(r) for r in getattr(summary, "culprit_ranks", ()) or ()]
        try:
            result.hang_kind = summary.classification.kind.value
            result.restart_advice = summary.classification.restart_advice()
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] classifying the hang failed", rank, exc_info=True)
        _write_collection(result)
    return result


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


def _write_collection(result: CollectionResult) -> None:
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
        "verdict": result.verdict,
        "culprit_ranks": result.culprit_ranks,
        "hang_kind": result.hang_kind,
        "restart_advice": result.restart_advice,
    }
    try:
        atomic_write_text(result.folder / COLLECTION_FILE, json.dumps(data, indent=2))
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] writing %s failed", result.event.initiator, COLLECTION_FILE, exc_info=True)
