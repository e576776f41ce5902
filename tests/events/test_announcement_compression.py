"""An announcement that carries a digest travels deflated with a preset dictionary, with a compact
header (the rank's own file names as suffixes, no folder); what comes back from the store is
inflated only up to the cap."""

from __future__ import annotations

import json
import tracemalloc
import zlib
from dataclasses import replace

import pytest

from lightning_ncclx.events.wire import (
    ANNOUNCEMENT_DICTIONARY, COMPRESSED_MARK, MAX_ANNOUNCEMENT_BYTES, Announcement, BadValue, compress_announcement,
    decompress_announcement,
)

DIGEST = b'{"schema":"lightning-ncclx/digest/2","context":{"event":"stall-001","rank":1}}'


def test_with_a_digest_the_value_is_compressed_and_reads_back_the_same() -> None:
    sent = Announcement(1, "node-1", ("rank_00001.gloo.fr.pkl",), "/d/stall-001", DIGEST)
    raw = sent.encode()
    assert raw[:1] == COMPRESSED_MARK and len(raw) < len(DIGEST)
    assert Announcement.parse(1, raw) == replace(sent, folder="")  # the folder stays in the rank's own log


def test_the_ranks_own_files_travel_as_suffixes_and_others_by_name() -> None:
    files = ("rank_00007.nccl.fr.pkl", "rank_00007.context.json", "nccl_trace_rank_7", "rank_00007.stacks.txt")
    sent = Announcement(7, "node-0", files, "/d", DIGEST, uploaded=True)
    plain = decompress_announcement(sent.encode())
    header = json.loads(plain.partition(b"\n")[0])
    assert header["own"] == [".nccl.fr.pkl", ".context.json", ".stacks.txt"]
    assert header["files"] == ["nccl_trace_rank_7"] and header["uploaded"] is True and "folder" not in header
    back = Announcement.parse(7, sent.encode())
    assert sorted(back.files) == sorted(files) and back.uploaded and back.digest == DIGEST


@pytest.mark.parametrize("own", [["/../../etc/passwd"], [".x/../../y"], "not a list", [".a"] * 65, [3]])
def test_a_planted_suffix_is_refused(own) -> None:
    plain = json.dumps({"rank": 1, "host": "h", "own": own, "digest_bytes": len(DIGEST)}).encode() + b"\n" + DIGEST
    with pytest.raises(BadValue):
        Announcement.parse(1, compress_announcement(plain))


def test_bytes_after_the_deflate_stream_are_refused() -> None:
    raw = Announcement(1, "node-1", (), "/d", DIGEST).encode()
    with pytest.raises(BadValue, match="after its end"):
        Announcement.parse(1, raw + b"planted")


def test_a_digest_announcement_of_a_16k_rank_job_stays_small() -> None:
    """What the 5 MiB goal per event at 16,384 ranks rests on: the header costs a few bytes."""
    sent = Announcement(16383, "node-2047", ("rank_16383.nccl.fr.pkl", "rank_16383.context.json",
                                             "rank_16383.stacks.txt"), "/scratch/run/ncclx_dumps/stall-001", DIGEST)
    bare = compress_announcement(b'{"rank":16383}\n' + DIGEST)
    assert len(sent.encode()) - len(bare) <= 24


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
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, dictionary)
    return COMPRESSED_MARK + packer.compress(plain) + packer.flush()


@pytest.mark.parametrize("raw", [
    _with_dictionary(b'{"rank": 1, "host": "h", "files": [], "folder": ""}\n',
                     b'{"rank": 1, "host": "h", "files": [], "folder": ""}\n'),  # another dictionary's words
    compress_announcement(b'{"rank": 1, "host": "h", "files": [], "folder": ""}\n')[:-6],  # truncated
    COMPRESSED_MARK + bytes(range(200)),  # not deflate at all
    b"x\x9c" + bytes(range(200)),  # neither plain nor marked
    compress_announcement(b"not json\n"),
    compress_announcement(b'{"rank": 2, "host": "h", "files": [], "folder": ""}\n'),  # another rank's
])
def test_a_compressed_value_that_is_not_an_announcement_is_refused(raw: bytes) -> None:
    with pytest.raises(BadValue):
        Announcement.parse(1, raw)


def test_the_dictionary_is_the_shared_words_and_fits_zlibs_window() -> None:
    assert 1000 < len(ANNOUNCEMENT_DICTIONARY) <= 32 * 1024
    assert b"lightning-ncclx/digest/2" in ANNOUNCEMENT_DICTIONARY
