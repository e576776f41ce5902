"""What one dump may make the reader hold, bounded, each bound on its own: entries (newest
kept), process groups (those with the newest entries kept), unfinished ops (oldest kept),
finished point-to-point ops (each group's newest kept), declared groups and members, name
lengths; ``RankTrace.cut`` says what was left out. Bounds are lowered with ``monkeypatch`` where
reaching the real one would only cost time."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from synth import collectives, dump, entry

from lightning_ncclx.analysis import compact, members, parse
from lightning_ncclx.analysis.parse import build_trace
from lightning_ncclx.errors import DumpReadError

WORLD2 = {"0": ("default_pg", [0, 1])}


def _trace(entries: list, groups: dict | None = None):
    return build_trace(dump(entries, WORLD2 if groups is None else groups), 0, "rank_0.pkl")


@pytest.mark.parametrize("common", [True, False], ids=["one group", "several groups"])
def test_past_max_entries_the_newest_are_read_and_the_total_is_told(monkeypatch, common: bool) -> None:
    monkeypatch.setattr(parse, "MAX_ENTRIES", 100)
    es = collectives(150, last_state="started")
    es[3]["process_group"] = ("1", "tp")  # older than the newest 100: never read
    if not common:
        es[120]["process_group"] = ("2", "tp")
    t = _trace(es, {**WORLD2, "1": ("tp", [0, 1]), "2": ("tp", [0, 1])})
    assert t.n_entries == 150 and t.cut == ("it holds 150 entries; the newest 100 were read",)
    newest = [s for s in range(51, 151) if common or s != 121]
    assert list(t.groups["0"].seqs) == newest and "1" not in t.groups
    assert common or list(t.groups["2"].seqs) == [121]
    assert [op.seq for op in t.open_ops] == [150]


def test_a_reader_that_kept_the_newest_says_how_many_the_file_held() -> None:
    t = build_trace(dump(collectives(10), WORLD2), 0, "rank_0.json", entries_total=383_781)
    assert t.n_entries == 383_781 and t.cut == ("it holds 383,781 entries; the newest 10 were read",)


def test_past_max_groups_those_with_the_newest_entries_are_read(monkeypatch) -> None:
    monkeypatch.setattr(parse, "MAX_GROUPS", 3)
    es = [entry(i, 1, pg=(f"g{i}", "sub")) for i in range(5)] + [entry(5, 2, pg=("g0", "sub"))]
    t = _trace(es)
    assert sorted(t.groups) == ["g0", "g3", "g4"]
    assert t.cut == ("it has collectives in 5 process groups; the 3 with the newest were read",)


def test_past_max_open_the_oldest_unfinished_ops_are_read(monkeypatch) -> None:
    monkeypatch.setattr(compact, "MAX_OPEN", 4)
    es = [entry(i, i + 1, state="started") for i in range(10)]
    for common in (True, False):
        if not common:
            es[0]["collective_seq_id"] = 5  # out of order: not the common dump
        t = _trace(es)
        assert [op.time_ns for op in t.open_ops] == [e["time_created_ns"] for e in es[:4]]
        assert t.cut == ("10 operations are unfinished in it; the oldest 4 were read",)


def test_finished_sends_and_receives_keep_only_each_groups_newest(monkeypatch) -> None:
    monkeypatch.setattr(parse, "MAX_OPEN", 2)
    sends = [entry(2 + i, 0, "send 0->1", pg=(pg, "pp"), p2p_seq=i + 1, is_p2p=True) for i, pg in
             enumerate(["a", "b", "a", "a", "b"])]
    pending = [entry(7 + i, 0, "recv 1<-0", p2p_seq=10 + i, is_p2p=True, state="scheduled") for i in range(3)]
    t = _trace(collectives(2) + sends + pending)
    assert [(p.group, p.seq, p.done) for p in t.p2p] == [("a", 4, True), ("b", 5, True), ("0", 10, False),
                                                          ("0", 11, False)]
    assert "3 sends and receives are unfinished in it; the oldest 2 were read" in t.cut


def test_pg_config_past_its_bounds_is_cut_and_said(monkeypatch) -> None:
    monkeypatch.setattr(members, "MAX_GROUP_ROWS", 2)
    cut: list[str] = []
    rows = {str(i): {"name": str(i), "desc": "g", "ranks": f"[{i}]"} for i in range(5)}
    assert list(members.parse_pg_config(rows, cut)) == ["0", "1"] and "declares 5 process groups" in cut[0]
    monkeypatch.setattr(members, "MAX_GROUP_ROWS", 4096)
    monkeypatch.setattr(members, "MAX_DECLARED_MEMBERS", 5)
    cut.clear()
    rows = {str(i): {"name": str(i), "desc": "g", "ranks": "[0, 1, 2]"} for i in range(3)}
    assert list(members.parse_pg_config(rows, cut)) == ["0"] and "only the first 1 were read" in cut[0]


def test_a_huge_op_dtype_or_group_name_reaches_no_report_whole() -> None:
    es = collectives(3, last_state="started")
    for e in es:
        e["profiling_name"] = "nccl:" + "x" * 10_000
        e["input_dtypes"] = ["F" * 10_000]
        e["process_group"] = ("0", "d" * 10_000)
    t = _trace(es)
    track = t.groups["0"]
    op, _, dtypes, _, _ = track.sig(0)
    assert len(op) == len(dtypes[0]) == len(track.desc) == 200
    assert len(t.open_ops[0].op) == len(t.open_ops[0].desc) == 200


def test_member_lists_are_parsed_once_and_shared_by_identity() -> None:
    text = str(list(range(5000)))
    first = members.parse_ranks(text)
    again = members.parse_ranks("".join(text))  # an equal string, another object
    assert again is first and len(first) == 5000


def test_the_member_cache_forgets_past_its_bound() -> None:
    seen = members._SeenLists(max_members=10, max_lists=8)
    first = seen.parsed("[0, 1, 2, 3, 4, 5]")
    seen.parsed("[6, 7, 8, 9, 10, 11]")  # 12 members in all: past the bound, the first is forgotten
    assert (seen._lists, seen._members) == (1, 6)
    assert seen.parsed("[0, 1, 2, 3, 4, 5]") == first


_TREES = """
import pickle, sys
from lightning_ncclx.analysis.parse import build_trace
from lightning_ncclx.errors import DumpReadError
try:
    build_trace(pickle.loads(sys.stdin.buffer.read()), 0, "rank_0.pkl")
except DumpReadError as exc:
    print(exc)
"""


def test_process_groups_that_are_memo_shared_trees_are_refused_before_any_compare() -> None:
    def tree(levels: int = 40) -> list:
        node: list = ["x"]
        for _ in range(levels):
            node = [node, node]  # 2**40 leaves when walked, 40 lists when pickled
        return node

    es = collectives(4)
    for e in es:
        e["process_group"] = tree()  # a tree of its own per entry: comparing two walks both
    # In a process of its own: a compare in C holds the GIL, so no timeout in this one could end it.
    proc = subprocess.run([sys.executable, "-c", _TREES], input=pickle.dumps(dump(es, WORLD2)), capture_output=True,
                          timeout=60)
    assert "process_group is not a" in proc.stdout.decode(), proc.stderr.decode()[-2000:]
