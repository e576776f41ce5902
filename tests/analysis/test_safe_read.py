"""safe_read: every byte the analyzer reads. Regular files only, capped sizes, a ``limit`` for
sniffing, a FIFO or device never blocks or is read forever, sizes in words, and the address-space
limit of :func:`bounded_memory` set and restored."""

from __future__ import annotations

import os
import resource
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lightning_ncclx.analysis.safe_read import (MAX_TRACE_BYTES, bounded_memory, file_kind, human_bytes,
                                                read_regular)
from lightning_ncclx.errors import DumpReadError


@pytest.mark.parametrize("n, words", [
    (0, "0 bytes"), (1023, "1023 bytes"), (1024, "1 KiB"), (1536, "1.5 KiB"), (16 << 20, "16 MiB"),
    ((10 << 20) + (1 << 19), "10 MiB"),  # ten and above: whole units only
    (int(1.9 * (1 << 30)), "1.9 GiB"), (512 << 20, "512 MiB"), (3 << 40, "3072 GiB"),
])
def test_human_bytes(n, words):
    assert human_bytes(n) == words


@pytest.mark.parametrize("mode, words", [
    (stat.S_IFDIR, "a folder"), (stat.S_IFIFO, "a FIFO"), (stat.S_IFSOCK, "a socket"),
    (stat.S_IFCHR, "a character device"), (stat.S_IFBLK, "a block device"), (stat.S_IFLNK, "not a regular file"),
])
def test_file_kind_in_words(mode, words):
    assert file_kind(mode | 0o644) == words


def _file(tmp_path: Path, data: bytes, name: str = "f") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_regular_file_up_to_the_cap_is_read_whole(tmp_path):
    assert read_regular(_file(tmp_path, b"0123456789"), cap=10) == b"0123456789"
    assert read_regular(_file(tmp_path, b"", "empty"), cap=10) == b""


def test_a_file_over_the_cap_is_refused_with_its_size_and_the_cap(tmp_path):
    with pytest.raises(DumpReadError) as err:
        read_regular(_file(tmp_path, b"x" * 11), cap=10, what="context file")
    assert str(err.value) == "context file is 11 bytes, over the 10 bytes cap"


def test_a_huge_sparse_dump_is_refused_before_reading(tmp_path):
    path = tmp_path / "rank_0.pkl"
    with open(path, "wb") as fh:
        fh.truncate(2 << 30)  # sparse: costs no disk, must cost no memory either
    with pytest.raises(DumpReadError) as err:
        read_regular(path, MAX_TRACE_BYTES, what="dump")
    assert str(err.value) == "dump is 2 GiB, over the 512 MiB cap"


def test_limit_reads_only_the_first_bytes_whatever_the_size(tmp_path):
    path = _file(tmp_path, b"\x80\x04" + b"y" * 100)
    assert read_regular(path, cap=10, limit=4) == b"\x80\x04yy"  # over the cap, but only sniffed
    assert read_regular(path, cap=3, limit=8) == b"\x80\x04y"  # the cap still bounds a limit
    assert read_regular(_file(tmp_path, b"ab", "short"), cap=10, limit=16) == b"ab"


def test_a_file_whose_stat_size_is_zero_but_that_yields_more_than_the_cap_is_refused():
    status = Path("/proc/self/status")  # size 0 in stat, hundreds of bytes when read
    if not status.exists():
        pytest.skip("needs /proc")
    assert len(read_regular(status, cap=1 << 20)) > 100
    with pytest.raises(DumpReadError, match=r"^file grew past the 10 bytes cap while being read$"):
        read_regular(status, cap=10)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "rank_0.pkl"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    with pytest.raises(DumpReadError) as err:
        read_regular(fifo, cap=1 << 20, what="dump")
    assert str(err.value) == "dump is a FIFO, not a regular file: not read"


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(DumpReadError, match=r"^file is a folder, not a regular file: not read$"):
        read_regular(tmp_path, cap=1 << 20)


def test_a_symlink_to_a_device_is_refused_not_read_forever(tmp_path):
    link = tmp_path / "rank_0.pkl"
    link.symlink_to("/dev/zero")
    with pytest.raises(DumpReadError, match=r"^file is a character device, not a regular file: not read$"):
        read_regular(link, cap=1 << 20)


def test_a_symlink_to_a_regular_file_reads_the_target(tmp_path):
    target = _file(tmp_path, b"payload", "real")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert read_regular(link, cap=100) == b"payload"


def test_a_dangling_symlink_or_missing_file_cannot_be_opened(tmp_path):
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    for path in (link, tmp_path / "missing"):
        with pytest.raises(DumpReadError) as err:
            read_regular(path, cap=100, what="stacks file")
        assert str(err.value) == "cannot open stacks file: No such file or directory"


def test_a_path_through_a_file_cannot_be_opened(tmp_path):
    _file(tmp_path, b"x")
    with pytest.raises(DumpReadError, match=r"^cannot open file: Not a directory$"):
        read_regular(tmp_path / "f" / "inner", cap=100)


def test_a_unix_socket_is_refused_cleanly(tmp_path):
    path = tmp_path / "s"
    if len(str(path)) > 100:
        pytest.skip("path too long for AF_UNIX")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        with pytest.raises(DumpReadError) as err:
            read_regular(path, cap=100)
    finally:
        sock.close()
    assert str(err.value) == "cannot open file: No such device or address"  # open(2) on a socket: ENXIO


_BOUNDED_MEMORY_CHECK = """
import resource
import pytest
from lightning_ncclx.analysis.safe_read import bounded_memory

before = resource.getrlimit(resource.RLIMIT_AS)
with bounded_memory(1 << 30):
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    assert hard == before[1], (hard, before)
    assert soft != resource.RLIM_INFINITY and (1 << 30) < soft < (1 << 30) + (64 << 30), soft
    with bounded_memory(1 << 40):  # already lower than asked: left as it is
        assert resource.getrlimit(resource.RLIMIT_AS) == (soft, hard)
    with pytest.raises(MemoryError):
        bytearray(2 << 30)
assert resource.getrlimit(resource.RLIMIT_AS) == before
print("checked")
"""


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="only on Linux")
def test_bounded_memory_lowers_the_address_space_limit_and_restores_it():
    """In a process of its own: the limit is lowered only while no other thread runs, and a test
    worker may still hold a daemon thread an earlier test left ending."""
    done = subprocess.run([sys.executable, "-c", _BOUNDED_MEMORY_CHECK], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "checked", done.stderr[-4000:]


def test_bounded_memory_leaves_the_limit_alone_while_other_threads_run():
    before = resource.getrlimit(resource.RLIMIT_AS)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    try:
        with bounded_memory(1 << 20):
            assert resource.getrlimit(resource.RLIMIT_AS) == before
    finally:
        stop.set()
        worker.join()
