"""``lightning-ncclx history`` over run folders others can write: a bad ``summary.json`` (nested a
million deep, fields of the wrong type, a FIFO, a link to /dev/zero, a huge file, markup and
escape sequences) is listed with its reason and every other incident is still tallied, through
the real CLI in a subprocess, never a hang or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.report import write_reports

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, write  # noqa: E402

GROUPS = {"0": ("default_pg", [0, 1, 2, 3])}
SCHEMA = "lightning-ncclx/summary/1"


def _event_dumps(folder: Path) -> None:
    """An event folder whose rank 2 never dumped (rank_lost), contexts naming hosts."""
    folder.mkdir(parents=True)
    for r in (0, 1, 3):
        write(folder, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8, last_state="started"), GROUPS))
        (folder / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "host": f"gpu-{r}", "world_size": 4, "phase": "train_step", "time_unix": 1_790_000_000.0,
             "event": folder.name}))
    (folder / "collection.json").write_text(json.dumps({"gone_ranks": [2], "missing_ranks": [2]}))


@pytest.fixture
def good_run(tmp_path: Path) -> Path:
    folder = tmp_path / "runs" / "good" / "stall-001"
    _event_dumps(folder)
    write_reports(analyze_folder(folder, workers=1), folder)
    return tmp_path / "runs"


def _history(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "history", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def _summary(**fields: object) -> str:
    return json.dumps({"schema": SCHEMA, "hang_kind": "rank_lost", **fields})


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    "deep nesting": (lambda p: p.write_text("[" * 1_000_000 + "]" * 1_000_000), "not JSON (RecursionError"),
    "ranks of the wrong type": (lambda p: p.write_text(_summary(culprit_ranks=7)), "culprit_ranks is 7, not a list"),
    "a rank that is text": (lambda p: p.write_text(_summary(culprit_ranks=["1"])), "culprit_ranks is a list"),
    "findings a number": (lambda p: p.write_text(_summary(findings=5)), "findings is 5, not a list of findings"),
    "states a number": (lambda p: p.write_text(_summary(findings=[{"culprit_states": 3}])),
                        "findings.0.culprit_states is 3"),
    "run id a list": (lambda p: p.write_text(_summary(incident={"run_id": ["a"]})), "incident.run_id is a list"),
    "time a number": (lambda p: p.write_text(_summary(incident={"dumped_at": 5})), "incident.dumped_at is 5"),
    "host a number": (lambda p: p.write_text(_summary(culprit_ranks=[1], hosts={"1": 3})), "hosts.1 is 3"),
    "kind an object": (lambda p: p.write_text(_summary(hang_kind={"a": 1})), "hang_kind is a dict"),
    "a FIFO": (lambda p: os.mkfifo(p), "summary.json is a FIFO, not a regular file"),
    "a link to /dev/zero": (lambda p: p.symlink_to("/dev/zero"), "summary.json is a character device"),
    "a huge file": (lambda p: _sparse(p, 3 << 30), "summary.json is 3 GiB, over the 16 MiB cap"),
    "not UTF-8": (lambda p: p.write_bytes(b'{"schema": "\xff\xfe"}'), "not JSON (UnicodeDecodeError"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_summary_is_listed_and_the_others_are_tallied(good_run: Path, case: str) -> None:
    make, reason = BAD[case]
    bad = good_run / "bad" / "stall-009" / "summary.json"
    bad.parent.mkdir(parents=True)
    make(bad)
    result = _history(str(good_run))
    assert result.returncode == 0, result.stderr
    assert "1 incident(s) in 1 run(s)" in result.stdout and "by culprit host: gpu-2" not in result.stdout
    assert f"skipped {bad}: {reason}" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "internal error" not in result.stderr
    as_json = json.loads(_history(str(good_run), "--format", "json").stdout)
    assert len(as_json["list"]) == 1 and as_json["skipped"][0].startswith(f"{bad}: {reason}")


def test_markup_and_escape_sequences_in_fields_are_shown_inert(good_run: Path) -> None:
    planted = good_run / "planted" / "stall-002" / "summary.json"
    planted.parent.mkdir(parents=True)
    planted.write_text(_summary(culprit_ranks=[1], hosts={"1": "gpu-[/x]\x1b[31m"}, incident={"event": "e[/]"}))
    result = _history(str(good_run))
    assert result.returncode == 0, result.stderr
    assert "2 incident(s)" in result.stdout and "gpu-[/x]\\x1b[31m 1" in result.stdout
    assert "\x1b[31m" not in result.stdout


def test_an_unsummarized_event_with_a_fifo_context_is_analyzed_without_waiting(good_run: Path) -> None:
    folder = good_run / "killed" / "stall-003"
    _event_dumps(folder)
    (folder / "rank_00003.context.json").unlink()
    os.mkfifo(folder / "rank_00003.context.json")
    result = _history(str(good_run / "killed"), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["list"][0]["kind"] == "rank_lost"


def test_debug_is_taken_after_the_command_as_the_error_line_suggests(good_run: Path) -> None:
    result = _history(str(good_run), "--debug")
    assert result.returncode == 0, result.stderr
    assert "1 incident(s)" in result.stdout
