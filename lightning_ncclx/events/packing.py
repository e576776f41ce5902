"""A rank's dump files as one xz'd tar that travels through the store, and back to files.

Sending: :func:`pack_files`, then :func:`put_blob` stores it in chunks of ``CHUNK_BYTES`` under
``ev/<n>/blob/<r>/<i>`` and a small manifest at ``ev/<n>/blob/<r>`` (set last), because the store
refuses a value over 8 MiB and drops the sender's connection.

Receiving is hostile-input work: :func:`fetch_blob` streams the chunks into a temporary file
(capped), and :func:`unpack` writes only regular members with plain names, each capped as the
offline reader caps a dump file, the whole capped too, streamed to disk, inside the given folder.

Example::

    put_blob(client, number=3, rank=1, blob=pack_files(paths))
    archive = fetch_blob(client, 3, 1, scratch_dir)      # None when absent or bad
    written = unpack(archive, event_folder / "ranks" / host, inside=dump_dir)
"""

from __future__ import annotations

import io
import json
import logging
import lzma
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

from lightning_ncclx.analysis.safe_read import MAX_SIDE_FILE_BYTES, MAX_TRACE_BYTES
from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.keys import blob_key, is_safe_name
from lightning_ncclx.events.wire import BadValue, as_int, json_object
from lightning_ncclx.layout import TRACE_SUFFIX

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024
"""Half the store's value limit: a chunk never comes near it."""
MAX_BLOB_BYTES = 256 * 1024 * 1024
MAX_CHUNKS = MAX_BLOB_BYTES // CHUNK_BYTES
MAX_MEMBERS = 64
MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
COPY_BYTES = 1024 * 1024
XZ_PRESET = 1
XZ_MAGIC = b"\xfd7zXZ\x00"
MAX_XZ_MEMORY = 64 * 1024 * 1024
"""The xz decoder's memory cap: preset 1 needs ~2 MiB; a planted stream may declare up to 4 GiB."""


def pack_files(files: Iterable[Path]) -> bytes:
    """An xz'd tar (preset 1: a flight-recorder dump is mostly repeated frames and op names, xz
    keeps ~45 % fewer bytes than gzip at about the same speed)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=XZ_PRESET) as tar:
        for path in files:
            tar.add(str(path), arcname=path.name, recursive=False)
    return buffer.getvalue()


class _BoundedXZ(io.RawIOBase):
    """An xz stream's bytes, inflated with at most ``MAX_XZ_MEMORY`` for the decoder: a stream
    that declares a larger dictionary is refused before anything is allocated for it."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        self._decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=MAX_XZ_MEMORY)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            if self._decoder.eof:
                return 0
            if self._decoder.needs_input:
                block = self._source.read(COPY_BYTES)
                if not block:
                    raise EOFError("the xz stream ends early")
                self._pending = self._decoder.decompress(block, max_length=len(buffer))
            else:
                self._pending = self._decoder.decompress(b"", max_length=len(buffer))
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


def _open_archive(source: BinaryIO) -> tarfile.TarFile:
    """The tar inside ``source``: xz (what :func:`pack_files` writes) or gzip."""
    head = source.read(len(XZ_MAGIC))
    source.seek(0)
    if head == XZ_MAGIC:
        return tarfile.open(fileobj=io.BufferedReader(_BoundedXZ(source), COPY_BYTES), mode="r|")
    return tarfile.open(fileobj=source, mode="r|gz")


def put_blob(client: StoreClient, number: int, rank: int, blob: bytes) -> bool:
    """Store ``blob`` in chunks, manifest last; False (nothing stored) when it is over the cap."""
    if len(blob) > MAX_BLOB_BYTES:
        log.warning("[rank %d] packed dump of %d bytes is over %d: not sent through the store", rank, len(blob),
                    MAX_BLOB_BYTES)
        return False
    count = max(1, -(-len(blob) // CHUNK_BYTES))
    for index in range(count):
        client.set(blob_key(number, rank, index), blob[index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES])
    client.set(blob_key(number, rank), json.dumps({"chunks": count, "bytes": len(blob)}))
    return True


def blob_keys(number: int, rank: int, chunks: int = MAX_CHUNKS) -> list[str]:
    """Every key a blob of up to ``chunks`` chunks may use (for deletion)."""
    return [blob_key(number, rank)] + [blob_key(number, rank, i) for i in range(chunks)]


def read_manifest(raw: bytes | None, rank: int) -> tuple[int, int]:
    data = json_object(raw, 256, f"rank {rank}'s dump manifest")
    chunks = as_int(data.get("chunks"), f"rank {rank}'s dump chunks", 1, MAX_CHUNKS + 1)
    size = as_int(data.get("bytes"), f"rank {rank}'s dump size", 0, MAX_BLOB_BYTES + 1)
    if size > chunks * CHUNK_BYTES or size <= (chunks - 1) * CHUNK_BYTES and size != 0:
        raise BadValue(f"rank {rank}'s dump manifest: {size} bytes do not fill {chunks} chunk(s)")
    return chunks, size


def fetch_blob(client: StoreClient, number: int, rank: int, scratch: Path) -> Path | None:
    """Rank ``rank``'s packed dump streamed into a temporary file under ``scratch`` (the caller
    removes it), or None when it is absent. Raises :class:`BadValue` on a malformed one."""
    raw = client.read(blob_key(number, rank))
    if raw is None:
        return None
    chunks, size = read_manifest(raw, rank)
    scratch.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=".blob-", suffix=".partial", dir=scratch)
    path = Path(name)
    written = 0
    try:
        with os.fdopen(handle, "wb") as out:
            for index in range(chunks):
                part = client.read(blob_key(number, rank, index))
                if part is None:
                    raise BadValue(f"rank {rank}'s dump: chunk {index} of {chunks} is missing")
                written += len(part)
                if len(part) > CHUNK_BYTES or written > size:
                    raise BadValue(f"rank {rank}'s dump: chunk {index} makes {written} bytes, {size} announced")
                out.write(part)
        if written != size:
            raise BadValue(f"rank {rank}'s dump: {written} bytes arrived, {size} announced")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def member_cap(name: str) -> int:
    return MAX_TRACE_BYTES if name.endswith(TRACE_SUFFIX) else MAX_SIDE_FILE_BYTES


@dataclass
class Unpacked:
    written: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """One line per member left out, with the reason."""


def is_inside(path: Path, folder: Path) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def unpack(archive: Path | bytes, folder: Path, *, inside: Path, skip: Callable[[str], bool] = lambda name: False,
           total_cap: int = MAX_UNPACKED_BYTES) -> Unpacked:
    """Write the regular files of a packed dump into ``folder``, which must lie inside ``inside``
    (the run's dump folder). Members with other than plain names, links, devices, members over
    their cap and anything past ``total_cap`` are refused and listed. Raises :class:`BadValue`
    when the folder leaves ``inside``; an archive that is not an xz'd or gzip'd tar, or whose xz
    decoder would need more than ``MAX_XZ_MEMORY``, is listed as unreadable."""
    result = Unpacked()
    folder = Path(folder)
    if not is_inside(folder, inside):
        raise BadValue(f"{folder} is outside the dump folder {inside}")
    source = io.BytesIO(archive) if isinstance(archive, (bytes, bytearray)) else open(archive, "rb")
    total = 0
    try:
        with _open_archive(source) as tar:
            for index, member in enumerate(tar):
                if index >= MAX_MEMBERS:
                    result.refused.append(f"more than {MAX_MEMBERS} members: the rest left out")
                    break
                name = member.name
                if member.size > member_cap(name) or total + member.size > total_cap:
                    # no dump holds such a member: stop before decompressing it (a gzip bomb)
                    result.refused.append(f"{name[:80]!r}: {member.size} bytes, over the cap: the rest left out")
                    break
                total += member.size  # skipped members are read through as well
                if not member.isfile() or not is_safe_name(name) or name.startswith("."):
                    result.refused.append(f"{name[:80]!r}: not a regular file with a plain name")
                    continue
                if skip(name):
                    continue
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                target = folder / name
                if not is_inside(target.parent, inside):
                    raise BadValue(f"{target} is outside the dump folder {inside}")
                _stream_to(handle, target, member.size)
                result.written.append(target)
    except (tarfile.TarError, EOFError, OSError, ValueError, lzma.LZMAError) as error:
        if isinstance(error, BadValue):
            raise
        result.refused.append(f"archive unreadable after {len(result.written)} file(s): {type(error).__name__}")
    finally:
        source.close()
    return result


def _stream_to(handle: io.BufferedReader | object, target: Path, size: int) -> int:
    """Copy at most ``size`` bytes into ``target`` through a temporary file, then rename: a
    reader never sees half of it. The kernel applies the umask to the new file."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    copied = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while copied < size:
                block = handle.read(min(COPY_BYTES, size - copied))  # type: ignore[attr-defined]
                if not block:
                    break
                out.write(block)
                copied += len(block)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return copied
