"""The one atomic writer: readers never see half a file; modes and symlinks are respected."""

from __future__ import annotations

import os
import queue
import stat
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from lightning_ncclx.files import atomic_write_bytes, atomic_write_text


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text("old")
    os.chmod(path, 0o600)
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_symlink_to_a_device_is_written_through_not_replaced(tmp_path: Path) -> None:
    link = tmp_path / "out"
    link.symlink_to("/dev/null")
    atomic_write_bytes(link, b"report")
    assert link.is_symlink() and os.readlink(link) == "/dev/null"


def test_a_symlink_to_a_file_updates_the_file(tmp_path: Path) -> None:
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    """Set here, on the test's main thread, before any thread of the test starts."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _at_every_c_return(call: Callable[[], None], observe: Callable[[], None]) -> None:
    """Run ``call`` with ``observe()`` after each C function it calls returns: every moment
    another thread could take over (the process umask changes only in such a call)."""
    def profile(frame, event, arg) -> None:
        if event == "c_return":
            observe()

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)


def test_another_threads_new_files_get_the_umask_at_every_moment_of_a_write(tmp_path: Path) -> None:
    """A writer that set the process-wide umask even for two calls would give a file another
    thread creates meanwhile other permissions."""
    others = tmp_path / "other_thread"
    others.mkdir()
    requests: queue.Queue[str | None] = queue.Queue()
    created: queue.Queue[str] = queue.Queue()

    def create_files() -> None:
        while (name := requests.get()) is not None:
            (others / name).touch()
            created.put(name)

    def another_thread_creates_a_file() -> None:
        requests.put(f"file{len(list(others.iterdir()))}")
        created.get()

    worker = threading.Thread(target=create_files, name="creates-files")
    with _umask(0o077):
        worker.start()
        try:
            _at_every_c_return(lambda: atomic_write_bytes(tmp_path / "summary.json", b"{}"),
                               another_thread_creates_a_file)
        finally:
            requests.put(None)
            worker.join()
    modes = {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in others.iterdir()}
    assert len(modes) > 5 and set(modes.values()) == {"0o600"}, modes
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == 0o600


def test_a_new_file_gets_the_mode_of_any_new_file(tmp_path: Path) -> None:
    with _umask(0o027):
        atomic_write_text(tmp_path / "new.json", "{}")
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640


def test_the_temporary_file_is_never_more_readable_than_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "secret.json"
    path.write_text("old")
    os.chmod(path, 0o600)
    modes: set[int] = set()

    def temporary_files_modes() -> None:
        modes.update(stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob(".secret.json.*.tmp"))

    with _umask(0o022):
        _at_every_c_return(lambda: atomic_write_text(path, "new"), temporary_files_modes)
    assert modes and all(mode & ~0o600 == 0 for mode in modes), [oct(m) for m in modes]
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o600
