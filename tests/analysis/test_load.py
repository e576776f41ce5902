"""Finding, reading and deduplicating dump files; every bad-input mode."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path

import pytest
from synth import collectives, dump, write

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.analysis.discover import rank_from_folders, rank_from_name
from lightning_ncclx.analysis.load import load_folder
from lightning_ncclx.errors import DumpReadError

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl-h200"


@pytest.mark.parametrize("name, expected", [
    ("rank_00003.nccl2.fr.pkl", 3), ("nccl_trace_rank_3", 3), ("comm_lib_trace_rank_12", 12),
    ("trace_3.json", 3), ("rank_0.pkl", 0), ("rank3.json", 3), ("trace-rank-5.pickle", 5),
    ("nccl_trace_rank_12", 12), ("RANK-7.json.gz", 7), ("fr.pkl", None), ("README.md", None),
    ("rank_2_step_400.pkl", 2),
])
def test_the_rank_in_a_file_name(name, expected):
    assert rank_from_name(name) == expected


def test_the_rank_of_the_nearest_folder_named_like_one(tmp_path):
    assert rank_from_folders(tmp_path / "gathered" / "host7" / "rank_3" / "fr.pkl", tmp_path) == 3
    assert rank_from_folders(tmp_path / "gathered" / "host7" / "fr.pkl", tmp_path) is None
    assert rank_from_folders(tmp_path / "12" / "sub" / "fr.pkl", tmp_path) == 12


def test_real_nccl_pickle_and_json_read_alike():
    pkl = load_folder(DATA / "ws1_2000_entries.pkl").traces[0]
    js = load_folder(DATA / "ws1_2000_entries.json").traces[0]
    assert pkl.lib == js.lib == "nccl" and pkl.n_entries == js.n_entries == 2000
    assert pkl.groups["0"].seqs == js.groups["0"].seqs and pkl.groups["0"].sigs == js.groups["0"].sigs
    assert pkl.groups["0"].oldest_seq == 104 and pkl.groups["0"].newest_seq == 2103


def test_real_watchdog_timeout_dump_shows_the_stuck_all_reduce():
    s = analyze_folder(DATA / "watchdog_timeout_rank_0.pkl")
    assert s.verdict is Verdict.NO_HANG  # one rank, it entered: nobody is missing from it
    assert "all_reduce (seq 21)" in s.notes[0]
    row = s.per_rank[0]
    assert row.state == "in_collective" and row.location == "probe/timeout_probe.py:26 in <module>"


def test_pickle_and_json_mixed_and_duplicate_copies_are_deduplicated(tmp_path):
    for r in range(3):
        data = dump(collectives(5, last_state="scheduled" if r != 2 else "completed") if r != 2 else collectives(4),
                    {"0": ("default_pg", [0, 1, 2])})
        if r == 1:
            (tmp_path / "rank_00001.nccl.fr.json").write_text(json.dumps(data))
        else:
            write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", data)
    host_copy = tmp_path / "ranks" / "hostb"
    host_copy.mkdir(parents=True)
    shutil.copy(tmp_path / "rank_00002.nccl.fr.pkl", host_copy)
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("hello")
    s = analyze_folder(tmp_path)
    assert s.ranks_seen == (0, 1, 2) and s.unreadable == ()
    assert s.verdict is Verdict.NOT_ENTERED and s.culprit_ranks == (2,)


def test_missing_path_raises():
    with pytest.raises(DumpReadError, match="no such file"):
        load_folder("/nonexistent/dumps")


def test_empty_folder_gives_no_ranks(tmp_path):
    s = analyze_folder(tmp_path)
    assert s.ranks_seen == () and s.verdict is Verdict.NO_HANG


@pytest.mark.parametrize("content, why", [
    (random.Random(83).randbytes(64).replace(b"\x80", b"\x00").replace(b"{", b"("), "neither a pickle nor JSON"),
    (b"\x80\x04\x95\x10\x00\x00", "not a valid pickle"),
    (pickle.dumps([1, 2, 3]), "top level is list"),
    (pickle.dumps({"version": "1.0", "entries": []}), "unsupported flight-recorder format version"),
    (pickle.dumps({"version": "2.10", "entries": [{"nope": 1}]}), "malformed entry"),
    (b"{not json", "not valid JSON"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_bad_files_are_listed_as_unreadable_and_the_rest_analyzed(tmp_path, content, why):
    write(tmp_path, "rank_00000.nccl.fr.pkl", dump(collectives(3), {"0": ("default_pg", [0, 1])}))
    (tmp_path / "rank_00001.nccl.fr.pkl").write_bytes(content)
    s = analyze_folder(tmp_path)
    assert s.ranks_seen == (0,) and s.ranks_missing == (1,)
    assert len(s.unreadable) == 1 and why in s.unreadable[0].why
    assert s.unreadable[0].path.endswith("rank_00001.nccl.fr.pkl")


def test_parallel_loading_gives_the_same_traces(tmp_path):
    for r in range(30):
        write(tmp_path, f"nccl_trace_rank_{r}", dump(collectives(20), {"0": ("default_pg", list(range(30)))}))
    serial = load_folder(tmp_path, workers=1)
    parallel = load_folder(tmp_path, workers=2)
    assert [t.groups for t in serial.traces] == [t.groups for t in parallel.traces]


@pytest.mark.parametrize("empty_name", ["nccl_trace_rank_2", "rank_00002.nccl.fr.pkl", "dump-of-rank-2.pkl"])
def test_an_empty_dump_is_a_rank_that_never_entered_not_a_missing_one(tmp_path: Path, empty_name: str) -> None:
    """Rank 2 dumped an empty nccl2 buffer: whatever its file is called (torch's prefix, the plugin's layout
    with the legacy tag, a name of its own), it counts as the job's one backend."""
    groups = {"0": ("default_pg", [0, 1, 2])}
    for rank in (0, 1):
        write(tmp_path, f"nccl_trace_rank_{rank}", dump(collectives(3, lib="nccl2", last_state="scheduled"), groups))
    write(tmp_path, empty_name, dump([], groups))
    s = analyze_folder(tmp_path)
    assert {i.rank: i.backend for i in s.inputs} == {0: "nccl2", 1: "nccl2", 2: "nccl2"}
    assert (s.verdict, s.culprit_ranks) == (Verdict.NOT_ENTERED, (2,))
    assert "never entered" in s.findings[0].message
