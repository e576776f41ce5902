"""The two-phase gather on the initiator: every rank's digest first, then the full dumps of the
smaller side of the first diagnosis and a few peers.

1. The digests (:mod:`lightning_ncclx.dump.digest`, inside each announcement) are expanded, and
   read by the first diagnosis and the summary from memory; their dump files under
   ``ranks/<host>/`` are written after ``summary.json`` (from the reports' thread, see
   :class:`~lightning_ncclx.events.gather.ReportsWriter`): into ``.incoming/``, then each host's
   folder moved into place at once (one rename, not a replace per file: 16,384 ranks make 49,152
   files). A ``pg_config`` membership is
   written into ``DECLARATIONS_KEPT`` files at most.
2. The first diagnosis (:mod:`first_diagnosis`, in memory); :func:`ranks_to_pull` picks the
   smaller side.
3. ``want`` rings those ranks' bells; their full dumps replace their digests as they arrive (a
   wanted rank found gone is not waited for).

A digest that is not what this version writes costs only that rank's entry (``refused``).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path

from lightning_ncclx.dump.digest_expand import DigestError, Expanded, Runs, expand
from lightning_ncclx.events.collection import CollectionResult
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.first_diagnosis import FirstDiagnosis
from lightning_ncclx.events.pull import INCOMING_FOLDER, has_local_copy, names_in, pull_full, target_folder
from lightning_ncclx.layout import GATHERED_FOLDER

log = logging.getLogger(__name__)

MAX_FULL_DUMPS_PULLED = 64
DECLARATIONS_KEPT = 3
"""Expanded digests that declare one group membership: the analyzer takes a group's members from
the most common declaration, so three agreeing digests outvote one planted one."""
STAGING_FOLDER = "digests"


class _Declarations:
    """Say yes to each distinct (group, members) the first ``DECLARATIONS_KEPT`` times."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, Runs], int] = {}

    def keep(self, name: str, desc: str, runs: Runs) -> bool:
        key = (name, desc, runs)
        count = self._seen.get(key, 0)
        if count >= DECLARATIONS_KEPT:
            return False
        self._seen[key] = count + 1
        return True


class _StagedWriter:
    """Holds the expanded digests and, once :meth:`finish` is called (after ``summary.json``, from
    the reports' thread: the summary reads them from memory), writes them under
    ``.incoming/digests/<host>/`` (16,384 ranks make 49,152 files) and moves each host's folder
    into place. A file that cannot be written is logged and left out."""

    def __init__(self, staging: str) -> None:
        self.staging = staging
        self.failed = 0
        self._held: list[tuple[str, Expanded]] = []
        self._lock = threading.Lock()

    def put(self, host: str, expanded: Expanded) -> None:
        self._held.append((host, expanded))

    def _write(self) -> None:
        made: set[str] = set()
        held, self._held = self._held, []
        for host, expanded in held:
            folder = os.path.join(self.staging, host)
            try:
                if folder not in made:
                    os.makedirs(folder, exist_ok=True)
                    made.add(folder)
                for name, data in expanded.files().items():
                    with open(os.path.join(folder, name), "wb") as handle:
                        handle.write(data)
            except OSError:
                self.failed += 1
                if self.failed <= 3:
                    log.warning("writing an expanded digest into %s failed", folder, exc_info=True)

    def finish(self, gathered: Path) -> None:
        with self._lock:
            self._write()
            _move_into_place(Path(self.staging), gathered)


def expand_digests(coordinator: EventCoordinator, result: CollectionResult, writer: _StagedWriter,
                   first: FirstDiagnosis | None = None) -> list[int]:
    """First phase: the digests of the ranks whose dump is not in the event folder, handed to
    ``writer`` as dump files (and to ``first``); returns the ranks read from a digest."""
    present = names_in(result.folder)
    declarations = _Declarations()
    expanded: list[int] = []
    for rank, announcement in sorted(result.announced.items()):
        if announcement.digest is None or has_local_copy(present, rank, announcement.files):
            continue
        try:
            digest = expand(announcement.digest, rank, coordinator.world_size, declarations.keep)
        except DigestError as error:
            result.refused.append(f"rank {rank}'s digest: {error}")
            continue
        writer.put(announcement.host, digest)
        if first is not None:
            first.add(digest, announcement.host)
        result.gathered[rank] = str(target_folder(result.folder, announcement))
        expanded.append(rank)
    return expanded


def _move_into_place(staging: Path, gathered: Path) -> None:
    """Each host folder of ``staging`` becomes ``gathered/<host>`` (one rename where it does not
    exist yet, else file by file, never over a file already there: a full dump)."""
    if not staging.is_dir():
        return
    gathered.mkdir(parents=True, exist_ok=True)
    for host_folder in staging.iterdir():
        target = gathered / host_folder.name
        try:
            os.rename(host_folder, target)
            continue
        except OSError:
            pass
        target.mkdir(parents=True, exist_ok=True)
        for path in host_folder.iterdir():
            if not (target / path.name).exists():
                os.replace(path, target / path.name)
    shutil.rmtree(staging, ignore_errors=True)


def ranks_to_pull(summary: object | None, digests: list[int], peers: int) -> list[int]:
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


def _first_diagnosis(result: CollectionResult, rank: int, first: FirstDiagnosis | None, digests: list[int],
                     writer: _StagedWriter) -> object | None:
    try:
        if first is not None:
            return first.run(result.gone_ranks, result.silent_ranks, digests)
        writer.finish(result.folder / GATHERED_FOLDER)  # read from the files: they must be there
        from lightning_ncclx.analysis import analyze_folder

        return analyze_folder(result.folder, extra_roots=tuple(sorted({Path(p) for p in result.gathered.values()})))
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] diagnosing the digests failed", rank, exc_info=True)
        return None


def _start_first_diagnosis(result: CollectionResult, rank: int) -> FirstDiagnosis | None:
    try:
        return FirstDiagnosis(result.folder)
    except Exception:  # noqa: BLE001 - then the first diagnosis reads the expanded files
        log.warning("[rank %d] reading %s for the first diagnosis failed", rank, result.folder, exc_info=True)
        return None


def two_phase_gather(coordinator: EventCoordinator, result: CollectionResult, dump_dir: Path,
                     timeout_seconds: float, peers: int) -> None:
    """Digests, the first diagnosis, ``want``, the full dumps. The expanded digests' files are
    still being written when this returns if the summary can do without them
    (``result.digest_files``: finish them with :func:`finish_digest_files`)."""
    rank = coordinator.rank
    started = time.monotonic()
    first = _start_first_diagnosis(result, rank)
    writer = _StagedWriter(str(result.folder / INCOMING_FOLDER / STAGING_FOLDER))
    result.digest_files = writer
    want: list[int] = []
    digests: list[int] = []
    try:
        digests = expand_digests(coordinator, result, writer, first)
        result.timings["digests"] = time.monotonic() - started
        if digests:
            started = time.monotonic()
            want = ranks_to_pull(_first_diagnosis(result, rank, first, digests, writer), digests, peers)
            result.timings["first_diagnosis"] = time.monotonic() - started
        try:
            coordinator.request_full_dumps(result.event, want)  # also when empty: the others stop waiting for it
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] asking for the full dumps of %s failed", rank, want, exc_info=True)
            want = []
    finally:
        if first is None:  # the summary reads the files: they must be in place
            finish_digest_files(result)
    started = time.monotonic()
    pulled = _pull_full_dumps(coordinator, result, want, dump_dir, timeout_seconds)
    result.timings["full_dumps"] = time.monotonic() - started
    result.digest_only_ranks = [r for r in digests if r not in pulled]
    result.in_memory = first
    log.info("[rank %d] %s: two-phase gather: full dumps pulled from rank(s) %s, digests only from %d rank(s)",
             rank, result.event.name, pulled, len(result.digest_only_ranks))


def finish_digest_files(result: CollectionResult) -> None:
    """Wait for the expanded digests' files and move them under ``ranks/<host>/`` (next to any
    full dump already there, never over one). Never raises."""
    writer, result.digest_files = result.digest_files, None
    if writer is None:
        return
    started = time.monotonic()
    try:
        writer.finish(result.folder / GATHERED_FOLDER)
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] moving the expanded digests into %s failed", result.event.initiator, result.folder,
                    exc_info=True)
    if writer.failed:
        log.warning("[rank %d] %s: %d digest file(s) could not be written: an offline summarize of the folder "
                    "misses those ranks' digests", result.event.initiator, result.event.name, writer.failed)
    result.timings["digest_files"] = time.monotonic() - started


def _pull_full_dumps(coordinator: EventCoordinator, result: CollectionResult, want: list[int], dump_dir: Path,
                     timeout_seconds: float, poll_seconds: float = 0.05, liveness_every_seconds: float = 0.5) -> list[int]:
    """Wait for the wanted ranks' full dumps (up to ``timeout_seconds``), each over its digest; a
    wanted rank whose process is found gone meanwhile is not waited for (its digest stands in)."""
    pulled: list[int] = []
    pending = list(want)
    deadline = coordinator._clock() + timeout_seconds
    next_liveness = coordinator._clock() + liveness_every_seconds
    while pending:
        for r in list(pending):
            got = _try_pull(coordinator, result, r, dump_dir)
            if got is None:
                continue
            if got:
                pulled.append(r)
            pending.remove(r)
        if not pending or coordinator._clock() >= deadline:
            break
        if coordinator._clock() >= next_liveness:
            next_liveness = coordinator._clock() + liveness_every_seconds
            gone = sorted(_gone(coordinator, result) & set(pending))
            if gone:
                log.warning("[rank %d] %s: rank(s) %s gone: their digests stand in for them", coordinator.rank,
                            result.event.name, gone)
                pending = [r for r in pending if r not in gone]
                continue
        coordinator._sleep(poll_seconds)
    if pending:
        log.warning("[rank %d] %s: no full dump from rank(s) %s within %.0f s: their digests are used",
                    coordinator.rank, result.event.name, pending, timeout_seconds)
    return sorted(pulled)


def _try_pull(coordinator: EventCoordinator, result: CollectionResult, rank: int, dump_dir: Path) -> bool | None:
    try:
        return pull_full(coordinator, result, rank, dump_dir)
    except Exception:  # noqa: BLE001
        log.warning("[rank %d] pulling rank %d's full dump failed", coordinator.rank, rank, exc_info=True)
        return False


def _gone(coordinator: EventCoordinator, result: CollectionResult) -> set[int]:
    """Ranks whose process exited: found on this host, or reported by a rank of theirs."""
    try:
        return coordinator.check_local_peers(result.event) | coordinator.gone_ranks(result.event)
    except Exception:  # noqa: BLE001 - without liveness, the deadline
        log.warning("[rank %d] checking for exited ranks failed", coordinator.rank, exc_info=True)
        return set()
