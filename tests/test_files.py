"""The one atomic writer: readers never see half a file; modes and symlinks are respected."""

from __future__ import annotations

import os
import stat
from pathlib import Path

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
