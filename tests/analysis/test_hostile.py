"""Hostile and huge inputs: each guard on its own. Every case ends in a clear message or a
summary of the good ranks, quickly, and without a traceback."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from synth import collectives, dump, entry, write

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.analysis.frames import main_thread_user_frame
from lightning_ncclx.cli import main
from lightning_ncclx.report import render_json, render_markdown, render_text

GROUPS = {"0": ("default_pg", [0, 1, 2])}


def _good(folder: Path, ranks=(0, 1)) -> None:
    for r in ranks:
        write(folder, f"rank_{r}.pkl", dump(collectives(5, last_state="started"), GROUPS))


def _shared_deep(levels: int = 40) -> list:
    node: list = [1]
    for _ in range(levels):
        node = [node, node]  # pickled once per level thanks to the memo: 2**levels leaves when walked
    return node


def _in_thread(fn, timeout_s: float = 60):
    out: list = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(timeout_s)
    assert out, f"{fn} did not finish"
    return out[0]


def _bad_rank(folder: Path, data) -> str:
    _good(folder)
    (folder / "rank_2.pkl").write_bytes(data if isinstance(data, bytes) else pickle.dumps(data))
    s = _in_thread(lambda: analyze_folder(folder))
    assert s.ranks_seen == (0, 1)
    (u,) = s.unreadable
    return u.why


def test_memo_shared_sizes_are_refused_before_they_are_expanded(tmp_path):
    e = entry(0, 1)
    e["input_sizes"] = [_shared_deep()]
    raw = pickle.dumps(dump([e], GROUPS))
    assert len(raw) < 4096
    assert "input_sizes" in _bad_rank(tmp_path, raw)


def test_memo_shared_profiling_name_is_refused(tmp_path):
    e = entry(0, 1)
    node: tuple = ("x",)
    for _ in range(40):
        node = (node, node)
    e["profiling_name"] = node
    assert "profiling_name is tuple" in _bad_rank(tmp_path, dump([e], GROUPS))


def test_memo_shared_frames_read_as_unknown_and_the_dump_is_used(tmp_path):
    _good(tmp_path)
    es = collectives(4)
    es[-1]["frames"] = [{"filename": _shared_deep(), "line": _shared_deep(), "name": "f"}]
    write(tmp_path, "rank_2.pkl", dump(es, GROUPS))
    s = _in_thread(lambda: analyze_folder(tmp_path))
    assert s.culprit_ranks == (2,)


def test_memo_shared_version_string_is_refused(tmp_path):
    assert "'version' is list" in _bad_rank(tmp_path, {"version": _shared_deep(), "entries": []})


def _text_op(s: str) -> bytes:
    return b"\x8c" + bytes([len(s)]) + s.encode()


def test_deep_nesting_in_pickle_and_json_is_unreadable(tmp_path):
    n = 200_000  # entries = [[[[...]]]] 200,000 levels: n lists pushed, each appended to the one below
    deep = (b"\x80\x04}(" + _text_op("version") + _text_op("2.10") + _text_op("entries") + b"]" * n
            + b"a" * (n - 1) + b"u.")
    assert "entry is list, not a dict" in _bad_rank(tmp_path / "p", deep)
    why = _bad_rank(tmp_path / "j", b'{"version": "2.10", "entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert "not valid JSON" in why


@pytest.mark.parametrize("raw", [
    b"\x80\x04X" + (0xFFFFFFF0).to_bytes(4, "little") + b"abc",       # a string claiming 4 GiB
    b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b"abc",      # bytes claiming 1 TiB
], ids=["binunicode", "binbytes8"])
def test_claimed_lengths_beyond_the_file_fail_fast(tmp_path, raw):
    assert "not a valid pickle" in _bad_rank(tmp_path, raw)


_MEASURE = """
import sys
from pathlib import Path
from lightning_ncclx.analysis import analyze_folder
s = analyze_folder(sys.argv[1])
print(s.unreadable[0].why)
# this process's own high-water mark: ru_maxrss keeps the launching process's (a pytest worker
# that built a 16,384-rank summary is over 1 GiB) across the exec
print(int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) // 1024)
"""


def test_a_memo_index_that_would_allocate_gigabytes_stays_under_1_gib(tmp_path):
    # 7 bytes: LONG_BINPUT 400,000,000 makes the C unpickler size its memo to 6 GiB
    _good(tmp_path)
    (tmp_path / "rank_2.pkl").write_bytes(b"\x80\x04]r" + (400_000_000).to_bytes(4, "little") + b".")
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    why, peak_mib = proc.stdout.splitlines()
    assert "memory cap" in why and int(peak_mib) < 1024, proc.stdout


def test_side_files_that_are_fifos_never_block(tmp_path):
    _good(tmp_path, ranks=(0, 1, 2))
    for name in ("rank_00000.context.json", "rank_00001.stacks.txt", "collection.json"):
        os.mkfifo(tmp_path / name)
    s = _in_thread(lambda: analyze_folder(tmp_path))
    assert s.ranks_seen == (0, 1, 2)
    assert {Path(u.path).name: u.why for u in s.ignored}["rank_00000.context.json"].startswith("a FIFO")


def test_an_oversized_context_file_says_its_size(tmp_path):
    _good(tmp_path, ranks=(0, 1, 2))
    with open(tmp_path / "rank_00000.context.json", "wb") as fh:
        fh.truncate(20 << 20)
    s = analyze_folder(tmp_path)
    (u,) = s.unreadable
    assert u.why == "context file is 20 MiB, over the 16 MiB cap"


def test_a_huge_rank_in_a_file_name_is_not_believed(tmp_path):
    _good(tmp_path)
    write(tmp_path, "rank_30000000.pkl", dump(collectives(5), GROUPS))
    s = _in_thread(lambda: analyze_folder(tmp_path), 30)
    assert s.ranks_seen == (0, 1)
    assert "rank 30000000 from its file name is not believable" in s.unreadable[0].why


@pytest.mark.parametrize("seq, why", [(-3, "collective_seq_id is -3"), ("7", "collective_seq_id is '7'")])
def test_negative_or_string_sequence_ids_are_counted(tmp_path, seq, why):
    es = collectives(4)
    es[1]["collective_seq_id"] = seq
    es[2]["collective_seq_id"] = seq
    got = _bad_rank(tmp_path, dump(es, GROUPS))
    assert "2 of 4 entries" in got and why in got


def test_absurd_group_members_and_world_size_cost_nothing(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2]), "1": ("sub", [-1, 10**20])}
    for r in range(3):
        es = collectives(5 if r != 2 else 4, last_state="started" if r != 2 else "completed")
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(es, groups))
        (tmp_path / f"rank_{r:05d}.context.json").write_text(json.dumps({"rank": r, "world_size": 100_000}))
    s = _in_thread(lambda: analyze_folder(tmp_path), 30)
    assert s.verdict is Verdict.NOT_ENTERED and 2 in s.culprit_ranks
    assert render_text(s) and render_json(s)


def test_a_long_run_of_spaces_in_a_stack_line_is_linear():
    line = '  File "train.py", line 3, in step' + " " * 200_000 + "x\n"
    text = "--- thread 'MainThread' (id 1) ---\n" + line
    assert _in_thread(lambda: main_thread_user_frame(text), 10) is not None


@pytest.mark.parametrize("field, value, why", [
    ("input_dtypes", [7], "input_dtypes holds int"), ("input_sizes", "4", "input_sizes is str"),
    ("state", {"a": 1}, "state is dict"), ("process_group", ("0",), "process_group is not a (name, desc) pair"),
])
def test_wrong_typed_fields_make_the_file_unreadable_with_a_count(tmp_path, field, value, why):
    es = collectives(4, last_state="scheduled")  # the open entry: every field of it is read
    es[-1][field] = value
    got = _bad_rank(tmp_path, dump(es, GROUPS))
    assert "1 of 4 entries" in got and why in got


def test_dict_entries_are_unreadable(tmp_path):
    assert "'entries' is dict" in _bad_rank(tmp_path, {"version": "2.10", "entries": {"0": {}}})


def _odd_names(folder: Path) -> None:
    _good(folder)
    bad = "rank_2\n\x1b[31mEVIL<script>alert(1)|`x`.pkl"
    (folder / bad).write_bytes(b"\x80\x04garbage")


def test_text_and_markdown_escape_names_from_the_dumps(tmp_path):
    _odd_names(tmp_path)
    s = analyze_folder(tmp_path)
    text = render_text(s)
    assert "\x1b" not in text and "\\x1b[31mEVIL" in text and "rank_2\\x0a" in text
    md = render_markdown(s)
    assert "<script>" not in md and "\\<script\\>" in md and "\x1b" not in md
    assert json.loads(render_json(s))["unreadable"][0]["path"].endswith("`x`.pkl")


def test_undecodable_file_names_are_printed_escaped(tmp_path, capsys):
    _good(tmp_path)
    (tmp_path / "rank_1.pkl").write_bytes(b"\x80\x04garbage")
    os.rename(tmp_path / "rank_1.pkl", os.fsencode(tmp_path) + b"/rank_1\xff.pkl")
    assert main(["summarize", str(tmp_path), "--format", "text"]) == 1
    assert "rank_1\\udcff.pkl" in capsys.readouterr().out
    assert main(["summarize", str(tmp_path), "--format", "markdown", "-o", str(tmp_path / "o.md")]) == 1


def test_output_through_a_symlink_keeps_the_link_and_the_mode(tmp_path):
    _good(tmp_path / "d")
    target = tmp_path / "reports" / "hang.json"
    target.parent.mkdir()
    target.write_text("old")
    os.chmod(target, 0o640)
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    assert main(["summarize", str(tmp_path / "d"), "--format", "json", "-o", str(link)]) == 1
    assert link.is_symlink() and json.loads(target.read_text())["verdict"] == "dump_missing"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_output_to_dev_stdout_is_written_not_replaced(tmp_path):
    _good(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(tmp_path), "--format",
                           "json", "-o", "/dev/stdout"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["culprit_ranks"] == [2]


def test_an_unwritable_output_is_reported_cleanly(tmp_path, capsys):
    _good(tmp_path / "d")
    assert main(["summarize", str(tmp_path / "d"), "-o", str(tmp_path / "d" / "rank_0.pkl" / "x")]) == 2
    assert "cannot write" in capsys.readouterr().err
    existing_folder = tmp_path / "a-folder"  # unwritable as a file even for root
    existing_folder.mkdir()
    assert main(["summarize", str(tmp_path / "d"), "-o", str(existing_folder)]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert existing_folder.is_dir() and not any(existing_folder.iterdir())


def test_an_unexpected_error_is_one_line_and_exit_2_unless_debug(tmp_path, capsys, monkeypatch):
    import lightning_ncclx.analysis as analysis

    _good(tmp_path)

    def broken(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(analysis, "analyze_folder", broken)
    assert main(["summarize", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: ZeroDivisionError: a bug" in err and "--debug" in err
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "summarize", str(tmp_path)])
    with pytest.raises(ZeroDivisionError):
        main(["summarize", str(tmp_path), "--debug"])
