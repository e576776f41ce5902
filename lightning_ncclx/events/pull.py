"""Dumps pulled through the store onto the initiator's disk: ``<event>/ranks/<host>/``.

Example::

    got = pull_full(coordinator, result, rank=3, dump_dir=dump_dir)   # True, None (not there yet), False
"""

from __future__ import annotations

import logging
from pathlib import Path

from lightning_ncclx.events.collection import CollectionResult
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.packing import fetch_blob, unpack
from lightning_ncclx.events.wire import Announcement, BadValue
from lightning_ncclx.layout import CONTEXT_SUFFIX, GATHERED_FOLDER, INCOMING_FOLDER, rank_file, rank_prefix

log = logging.getLogger(__name__)

def has_local_copy(present: set[str], rank: int, files: tuple[str, ...]) -> bool:
    """Are ``rank``'s announced files (or its context file) among ``present``, the names in the
    event folder?"""
    prefix = rank_prefix(rank)
    names = [n for n in files if n.startswith(prefix)] or [rank_file(rank, CONTEXT_SUFFIX)]
    return all(n in present for n in names)


def names_in(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir() if p.is_file()}
    except OSError:
        return set()


def target_folder(folder: Path, announcement: Announcement | None) -> Path:
    return folder / GATHERED_FOLDER / (announcement.host if announcement is not None else "unknown-host")


def unpack_into(result: CollectionResult, source: Path | bytes, target: Path, dump_dir: Path, rank: int) -> list[Path]:
    unpacked = unpack(source, target, inside=dump_dir)
    result.refused += [f"rank {rank}'s dump: {line}" for line in unpacked.refused]
    return unpacked.written


def pull_full(coordinator: EventCoordinator, result: CollectionResult, rank: int, dump_dir: Path) -> bool | None:
    """Rank ``rank``'s full dump from the store into ``ranks/<host>/``: True when unpacked, None
    when it is not there (yet), False when it was refused."""
    folder = result.folder
    try:
        archive = fetch_blob(coordinator.client, result.event.number, rank, folder / INCOMING_FOLDER)
    except BadValue as error:
        result.refused.append(str(error))
        result.blobs_from.append(rank)
        return False
    if archive is None:
        return None
    result.blobs_from.append(rank)
    try:
        target = target_folder(folder, result.announced.get(rank))
        unpack_into(result, archive, target, dump_dir, rank)
        result.gathered[rank] = str(target)
        return True
    except BadValue as error:
        result.refused.append(str(error))
        return False
    finally:
        archive.unlink(missing_ok=True)
