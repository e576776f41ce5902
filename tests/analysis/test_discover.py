"""Discovery by content: any name, nested folders, pickle/JSON/gzip, ranks from names, folders or
content, duplicates named, and what is skipped reported (``inputs`` / ``ignored``)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import threading
from pathlib import Path

from synth import collectives, dump, write

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.cli import main

GROUPS = {"0": ("default_pg", [0, 1, 2])}


def _data(rank: int) -> dict:
    """A hang: rank 2 never entered seq 5."""
    return dump(collectives(4) if rank == 2 else collectives(5, last_state="started"), GROUPS)


def test_renamed_files_in_nested_folders_give_the_same_verdict(tmp_path):
    flat = tmp_path / "flat"
    for r in range(3):
        write(flat, f"nccl_trace_rank_{r}", _data(r))
    users = tmp_path / "users"
    write(users, "rank_0.pkl", _data(0))
    (users / "node-a").mkdir()
    (users / "node-a" / "rank1.json").write_text(json.dumps(_data(1)))
    nested = users / "gathered" / "host7" / "rank_2"
    nested.mkdir(parents=True)
    (nested / "fr.pkl").write_bytes(gzip.compress(pickle.dumps(_data(2))))
    a, b = analyze_folder(flat), analyze_folder(users)
    assert (b.verdict, b.culprit_ranks, b.waiting_ranks) == (a.verdict, a.culprit_ranks, a.waiting_ranks)
    assert b.verdict is Verdict.NOT_ENTERED and b.culprit_ranks == (2,)
    rows = {i.rank: i for i in b.inputs}
    assert (rows[0].rank_from, rows[0].fmt) == ("file name", "pickle")
    assert (rows[1].rank_from, rows[1].fmt) == ("file name", "json")
    assert (rows[2].rank_from, rows[2].fmt) == ("folder name", "gzip+pickle")
    assert rows[2].entries == 4 and rows[2].version == "2.10"


def test_duplicate_rank_keeps_the_newest_and_names_both(tmp_path):
    for r in range(3):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    old = dump(collectives(2), GROUPS)
    write(tmp_path / "old", "trace-rank-1.pickle", old)
    s = analyze_folder(tmp_path)
    assert s.culprit_ranks == (2,)
    (dup,) = s.duplicates
    assert dup.rank == 1 and dup.kept.endswith("rank_1.pkl") and dup.dropped.endswith("trace-rank-1.pickle")
    assert s.to_dict()["duplicates"][0]["dropped"].endswith("trace-rank-1.pickle")


def test_a_dump_without_any_rank_is_unreadable_with_the_fix(tmp_path):
    for r in range(2):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    write(tmp_path / "misc", "fr.pkl", _data(2))
    s = analyze_folder(tmp_path)
    (u,) = s.unreadable
    assert u.path.endswith("fr.pkl") and "name it rank_<N>" in u.why


def test_content_rank_wins_and_a_disagreeing_name_is_noted(tmp_path):
    for r in range(2):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    write(tmp_path, "rank_7.pkl", dict(_data(2), rank=2))
    s = analyze_folder(tmp_path)
    assert s.ranks_seen == (0, 1, 2) and s.culprit_ranks == (2,)
    assert any("says rank 7 but its content says rank 2" in n for n in s.notes)
    assert {i.rank: i.rank_from for i in s.inputs}[2] == "content"


def test_context_file_names_its_traces(tmp_path):
    for r in range(3):
        write(tmp_path, f"dump-{r}-of-3.bin", _data(r))
        (tmp_path / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "world_size": 3, "trace_files": [f"dump-{r}-of-3.bin"]}))
    s = analyze_folder(tmp_path)
    assert s.culprit_ranks == (2,) and {i.rank_from for i in s.inputs} == {"context"}


def test_junk_files_are_ignored_with_a_reason_and_a_tally(tmp_path, capsys):
    for r in range(3):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    for i in range(10_000):
        (tmp_path / f"log_{i}.txt").write_text("hello")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "notes.pkl").write_bytes(pickle.dumps(["not", "a", "dump"]))
    s = analyze_folder(tmp_path)
    assert s.culprit_ranks == (2,) and s.unreadable == ()
    why = {Path(u.path).name: u.why for u in s.ignored}
    assert len(why) == 10_002 and "not a dump" in why["log_0.txt"] and "not a flight-recorder dump" in why["config.json"]
    assert main(["summarize", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "inputs: 3 dumps read (3 pickle); 10002 files ignored (not dumps)" in out


def test_a_fifo_named_like_a_dump_is_never_opened(tmp_path):
    for r in range(2):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    os.mkfifo(tmp_path / "rank_2.pkl")
    done = []
    worker = threading.Thread(target=lambda: done.append(analyze_folder(tmp_path)), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "analyze_folder blocked on a FIFO"
    why = {Path(u.path).name: u.why for u in done[0].ignored}
    assert "a FIFO" in why["rank_2.pkl"]


def test_symlinks_out_of_the_folder_and_loops_are_not_followed(tmp_path):
    root = tmp_path / "dumps"
    for r in range(3):
        write(root, f"rank_{r}.pkl", _data(r))
    (root / "zero_rank_5.pkl").symlink_to("/dev/zero")
    (root / "loop").symlink_to(root)
    (root / "a").mkdir()
    (root / "a" / "back").symlink_to(root / "a")
    write(tmp_path / "outside", "rank_9.pkl", _data(0))
    (root / "elsewhere").symlink_to(tmp_path / "outside")
    s = analyze_folder(root)
    assert s.ranks_seen == (0, 1, 2) and s.culprit_ranks == (2,)
    why = {Path(u.path).name: u.why for u in s.ignored}
    assert "symlink out of the folder" in why["zero_rank_5.pkl"] and "symlink out" in why["elsewhere"]


def test_folders_deeper_than_the_bound_are_not_searched(tmp_path):
    deep = tmp_path
    for i in range(8):
        deep = deep / f"d{i}"
    write(deep, "rank_0.pkl", _data(0))
    write(tmp_path, "rank_1.pkl", _data(1))
    s = analyze_folder(tmp_path)
    assert s.ranks_seen == (1,)
    assert any("deeper than 6 folders" in u.why for u in s.ignored)


def test_a_huge_file_is_ignored_by_its_size_without_reading(tmp_path):
    for r in range(3):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    with open(tmp_path / "rank_3.pkl", "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB claimed, nothing on disk
    s = analyze_folder(tmp_path)
    assert s.culprit_ranks == (2,)
    why = {Path(u.path).name: u.why for u in s.ignored}
    assert why["rank_3.pkl"] == "1 GiB, over the 512 MiB cap for one dump"


def test_json_report_lists_inputs_and_ignored(tmp_path, capsys):
    for r in range(3):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    (tmp_path / "README").write_text("dumps from node a")
    assert main(["summarize", str(tmp_path), "--format", "json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [i["rank"] for i in d["inputs"]] == [0, 1, 2]
    assert set(d["inputs"][0]) == {"path", "rank", "rank_from", "backend", "format", "version", "comm_lib_version",
                                   "entries"}
    assert d["ignored"][0]["path"].endswith("README") and d["duplicates"] == []


def test_a_file_named_like_a_dump_is_sniffed_by_its_reader_with_the_same_verdicts(tmp_path):
    """Discovery opens no file whose name gives its rank (16,384 opens saved); what its first
    bytes say is then judged by the reader exactly as discovery judges the others."""
    for r in range(3):
        write(tmp_path, f"rank_{r}.pkl", _data(r))
    zstd = b"\x28\xb5\x2f\xfd" + os.urandom(32)
    (tmp_path / "rank_3.pkl").write_bytes(zstd)  # named: read, then refused by its first bytes
    (tmp_path / "compressed.bin").write_bytes(zstd)  # unnamed: refused at discovery
    (tmp_path / "rank_4.pkl").write_bytes(b"\x80\x01 not a pickle protocol this reads")
    s = analyze_folder(tmp_path)
    assert s.culprit_ranks == (2,)
    ignored = {Path(u.path).name: u.why for u in s.ignored}
    assert ignored["rank_3.pkl"] == ignored["compressed.bin"] == "zstd-compressed: decompress it first (zstd -d), then rerun"
    assert [(Path(u.path).name, u.why) for u in s.unreadable] == [
        ("rank_4.pkl", "neither a pickle nor JSON (unrecognised first byte)")]
