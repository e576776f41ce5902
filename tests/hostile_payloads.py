"""Crafted and random values for a hostile store client (:mod:`hostile_store`) to plant.

Each family is what a careless reader of a store value trips on: names that leave a folder,
JSON of the wrong shape, numbers that are not finite or do not fit, bytes that are not UTF-8,
a gzip'd tar whose member inflates to GiBs (built streaming: never held in memory), tars with
links and devices, values over the store's size limit, and a seeded mix of all of them.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import random
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

NOT_AN_OBJECT = ["[]", "[1, 2]", '[{"name": "x"}]', '"text"', "null", "42", "true", "{", ""]
"""JSON texts (and non-JSON) where a reader expects an object."""

HOSTILE_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" * 5000, str(2**64), str(-(2**63) - 1),
                   "-1", "0", "1.5", '"7"', "[0]", "{}"]
"""Raw JSON values for a field that should hold a small int or a finite float: Python's ``json``
reads NaN and Infinity, turns 1e999 into inf and refuses ints of more than 4300 digits."""

NON_UTF8 = [b"\xff\xfe\xfd", b'{"name": "\xff"}', b"\xc3\x28", b"\xed\xa0\x80", b"\x00" * 16]

_PLACEHOLDER = "\u0000hostile\u0000"


def escaping_names(folder: Path, target: Path) -> list[str]:
    """Names that, joined to ``folder``, lead to ``target`` outside it (absolute, ``..``, a detour
    through a subfolder), plus names that are not plain file names at all."""
    relative = os.path.relpath(target, folder)
    detour = os.path.relpath(target, folder / "sub")
    return [str(target), relative, f"sub/{detour}", f"./{relative}", "..", ".", "", "a/b", "x" * 300,
            "nul\x00byte", "new\nline"]


def json_with(base: dict[str, Any], field: str, raw_value: str) -> str:
    """``base`` as JSON with ``field`` set to ``raw_value`` as written (``NaN``, ``1e999``...)."""
    return json.dumps({**base, field: _PLACEHOLDER}).replace(json.dumps(_PLACEHOLDER), raw_value)


# ---------------------------------------------------------------------------------- tars
@dataclass(frozen=True)
class TarMember:
    """One member of a crafted tar: ``kind`` is file, dir, symlink, hardlink, fifo or chardev."""

    name: str
    data: bytes = b""
    kind: str = "file"
    target: str = ""


_TAR_TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
              "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "chardev": tarfile.CHRTYPE}


def tar_gz(members: Iterable[TarMember]) -> bytes:
    """A gzip'd tar of exactly these members (names as given: ``../x``, ``/abs``, links...)."""
    buffer = io.BytesIO()
    # mtime=0: the same members give the same bytes (the gzip header would stamp the current second)
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as packed, \
            tarfile.open(fileobj=packed, mode="w") as tar:
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.type = _TAR_TYPES[member.kind]
            info.mode = 0o644
            info.linkname = member.target
            info.size = len(member.data) if member.kind == "file" else 0
            if member.kind == "chardev":
                info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
            tar.addfile(info, io.BytesIO(member.data) if member.kind == "file" else None)
    return buffer.getvalue()


def gzip_bomb(inflated_bytes: int, member_name: str = "rank_00000.context.json") -> bytes:
    """A gzip'd tar whose one member is ``inflated_bytes`` zeros: about 1/1000 of that size.
    Written by hand (header, zeros, padding, end blocks) so no more than 1 MiB is ever held."""
    info = tarfile.TarInfo(member_name)
    info.size = inflated_bytes
    info.mode = 0o644
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0) as out:
        out.write(info.tobuf(format=tarfile.GNU_FORMAT))
        chunk = bytes(1 << 20)
        left = inflated_bytes
        while left > 0:
            out.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
        out.write(bytes(-inflated_bytes % tarfile.BLOCKSIZE))
        out.write(bytes(2 * tarfile.BLOCKSIZE))  # end of archive
    return buffer.getvalue()


def xz_bomb(inflated_bytes: int, member_name: str = "rank_00000.context.json") -> bytes:
    """An xz'd tar (as ``pack_files`` writes) whose one member is ``inflated_bytes`` zeros,
    written in 1 MiB pieces."""
    info = tarfile.TarInfo(member_name)
    info.size = inflated_bytes
    info.mode = 0o644
    packer = lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=1)
    parts = [packer.compress(info.tobuf(format=tarfile.GNU_FORMAT))]
    chunk = bytes(1 << 20)
    left = inflated_bytes
    while left > 0:
        parts.append(packer.compress(chunk[:min(left, len(chunk))]))
        left -= len(chunk)
    parts.append(packer.compress(bytes(-inflated_bytes % tarfile.BLOCKSIZE) + bytes(2 * tarfile.BLOCKSIZE)))
    parts.append(packer.flush())
    return b"".join(parts)


def xz_declaring_a_huge_dictionary(plain: bytes = b"hello") -> bytes:
    """A valid xz stream of ``plain`` whose block header declares LZMA2's largest dictionary
    (4 GiB - 1): a decoder without a memory cap would reserve that much."""
    packed = bytearray(lzma.compress(plain, format=lzma.FORMAT_XZ, preset=0))
    header_start = 12  # after the stream header
    header_size = (packed[header_start] + 1) * 4
    header = packed[header_start:header_start + header_size]
    at = header.index(b"\x21\x01") + 2  # LZMA2 filter id, one property byte: the dictionary size
    header[at] = 40
    header[-4:] = zlib.crc32(bytes(header[:-4])).to_bytes(4, "little")
    packed[header_start:header_start + header_size] = header
    return bytes(packed)


def incompressible_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def incompressible_tar_gz(size: int, member_name: str = "rank_00000.stacks.txt", seed: int = 0) -> bytes:
    """A valid gzip'd tar of at least ``size`` bytes (random data does not compress)."""
    return tar_gz([TarMember(member_name, incompressible_bytes(size, seed))])


# ---------------------------------------------------------------------------------- a random mix
def random_values(rng: random.Random, count: int, *, max_bytes: int = 64 * 1024) -> Iterator[bytes]:
    """``count`` values drawn from every family above and from random bytes and random JSON
    (no bombs: those are asked for by size)."""
    families = [
        lambda: rng.choice(NOT_AN_OBJECT).encode(),
        lambda: json_with({"name": "stall-001", "reason": "stall", "initiator": 0},
                          rng.choice(["name", "reason", "initiator", "host", "code", "pid"]),
                          rng.choice(HOSTILE_NUMBERS + [json.dumps(n) for n in ("..", "/etc", "a/../../b")])).encode(),
        lambda: rng.choice(NON_UTF8),
        lambda: rng.randbytes(rng.randrange(max_bytes)),
        lambda: json.dumps(_random_json(rng, depth=4)).encode()[:max_bytes],
        lambda: tar_gz([TarMember(rng.choice(["../x", "/tmp/x", "ok.json", "a/../../b"]), rng.randbytes(64),
                                  rng.choice(["file", "symlink", "hardlink", "dir"]), "/etc/passwd")]),
    ]
    for _ in range(count):
        yield rng.choice(families)()


def _random_json(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(7 if depth > 0 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 2**31, 2**63, rng.randrange(-10**6, 10**6)])
    if kind == 2:
        return rng.choice([0.5, -1e308, 1e308, 1e-320])
    if kind == 3:
        return rng.choice(["", "..", "/", "stall-001", "x" * 1000, "\u202e\u0000"])
    if kind == 4:
        return rng.randbytes(8).hex()
    if kind == 5:
        return [_random_json(rng, depth - 1) for _ in range(rng.randrange(4))]
    keys = ["name", "reason", "initiator", "host", "files", "folder", "code", "kind", "exit", "closed"]
    return {rng.choice(keys): _random_json(rng, depth - 1) for _ in range(rng.randrange(5))}
