"""``lightning-ncclx dump``'s answers without a job: a clear line and exit 2 for a path it cannot
use, exit 1 (the request withdrawn) when no running job takes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ncclx.dump.request import running_dump_folders
from support import clean_env


def _dump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "dump", *args], capture_output=True,
                          text=True, timeout=60, env=clean_env())


def _unwritable_folder(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
        return folder
    if not os.access("/sys/kernel", os.F_OK):
        pytest.skip("as root, no folder here refuses a new file")
    return Path("/sys/kernel")


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    done = _dump(str(tmp_path / "nope"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"lightning-ncclx dump: no such folder: {tmp_path / 'nope'}\n"


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    done = _dump(str(tmp_path / "f"))
    assert done.returncode == 2 and "not a folder" in done.stderr and "Traceback" not in done.stderr


def test_an_unwritable_folder_is_named_with_the_reason(tmp_path: Path) -> None:
    folder = _unwritable_folder(tmp_path)
    done = _dump(str(folder), "--wait", "1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"lightning-ncclx dump: cannot write the request {folder / 'DUMP_NOW'}: ")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [["--wait", "nan"], ["--wait", "-1"], ["--file", "../DUMP_NOW"], ["--file", ""]])
def test_bad_options_are_refused(tmp_path: Path, args: list[str]) -> None:
    done = _dump(str(tmp_path), *args)
    assert done.returncode == 2 and done.stderr.startswith("lightning-ncclx dump: --"), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_request_nobody_takes_is_withdrawn(tmp_path: Path) -> None:
    done = _dump(str(tmp_path), "--wait", "0.5")
    assert done.returncode == 1, done.stderr
    assert "no running job took" in done.stderr and "withdrawn" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_waiting_the_request_stays_for_the_job(tmp_path: Path) -> None:
    done = _dump(str(tmp_path), "--wait", "0")
    assert done.returncode == 0 and (tmp_path / "DUMP_NOW").is_file()


def test_a_running_jobs_dump_folder_is_found_below_the_run_folder(tmp_path: Path) -> None:
    running = tmp_path / "ncclx_dumps" / "run-2"
    running.mkdir(parents=True)
    (tmp_path / "ncclx_dumps" / "run-1").mkdir()  # an earlier run: its watchdog has stopped
    (running / ".rank_00000.native-stacks.txt").write_text("# main thread\n")
    assert running_dump_folders(tmp_path) == [running]
    assert running_dump_folders(tmp_path / "ncclx_dumps") == [running]


def test_two_running_jobs_under_one_folder_are_listed_not_guessed(tmp_path: Path) -> None:
    for run in ("run-1", "run-2"):
        (tmp_path / "ncclx_dumps" / run).mkdir(parents=True)
        (tmp_path / "ncclx_dumps" / run / ".rank_00000.native-stacks.txt").write_text("")
    done = _dump(str(tmp_path), "--wait", "0")
    assert done.returncode == 2 and "2 running jobs write dumps under" in done.stderr
    assert not list(tmp_path.rglob("DUMP_NOW"))
