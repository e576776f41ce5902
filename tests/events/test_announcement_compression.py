"""An announcement that carries a digest travels zlib-compressed with a preset dictionary; what
comes back from the store is inflated only up to the cap, and only with that dictionary."""

from __future__ import annotations

import tracemalloc
import zlib

import pytest

from lightning_ncclx.events.wire import (
    ANNOUNCEMENT_DICTIONARY, MAX_ANNOUNCEMENT_BYTES, Announcement, BadValue, compress_announcement,
)

DIGEST = b'{"schema":"lightning-ncclx/digest/2","context":{"event":"stall-001","rank":1}}'


def test_with_a_digest_the_value_is_compressed_and_reads_back_the_same() -> None:
    sent = Announcement(1, "node-1", ("rank_00001.gloo.fr.pkl",), "/d/stall-001", DIGEST)
    raw = sent.encode()
    assert raw[:1] == b"x" and len(raw) < len(DIGEST)
    assert Announcement.parse(1, raw) == sent


def test_without_a_digest_the_value_stays_plain_json() -> None:
    sent = Announcement(1, "node-1", (), "/d")
    assert sent.encode()[:1] == b"{"
    assert Announcement.parse(1, sent.encode()) == sent


def test_a_value_that_inflates_past_the_cap_is_refused_without_inflating_it() -> None:
    bomb = compress_announcement(b'{"rank": 1}\n' + b"\x00" * (64 * MAX_ANNOUNCEMENT_BYTES))
    assert len(bomb) < MAX_ANNOUNCEMENT_BYTES // 8
    tracemalloc.start()
    try:
        with pytest.raises(BadValue, match="cap"):
            Announcement.parse(1, bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_ANNOUNCEMENT_BYTES, peak  # stopped at the cap, not after 64 MiB


def _with_dictionary(plain: bytes, dictionary: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, dictionary)
    return packer.compress(plain) + packer.flush()


@pytest.mark.parametrize("raw", [
    _with_dictionary(b'{"rank": 1, "host": "h", "files": [], "folder": ""}\n', b"another dictionary"),
    compress_announcement(b'{"rank": 1, "host": "h", "files": [], "folder": ""}\n')[:-6],  # truncated
    b"x\x9c" + bytes(range(200)),  # not deflate at all
    compress_announcement(b"not json\n"),
    compress_announcement(b'{"rank": 2, "host": "h", "files": [], "folder": ""}\n'),  # another rank's
])
def test_a_compressed_value_that_is_not_an_announcement_is_refused(raw: bytes) -> None:
    with pytest.raises(BadValue):
        Announcement.parse(1, raw)


def test_the_dictionary_is_the_shared_words_and_fits_zlibs_window() -> None:
    assert 1000 < len(ANNOUNCEMENT_DICTIONARY) <= 32 * 1024
    assert b"lightning-ncclx/digest/2" in ANNOUNCEMENT_DICTIONARY
