"""compact: the common dump (one group, sequence ids 1, 2, 3, ...) read in a few C-level passes
gives exactly the trace the entry-by-entry path gives, and every other dump is left to that path."""

from __future__ import annotations

import pytest
from synth import collectives, dump, entry

from lightning_ncclx.analysis import parse
from lightning_ncclx.analysis.compact import CALLSITE_WINDOW, callsite_tail, compact_common
from lightning_ncclx.analysis.parse import build_trace

WORLD2 = {"0": ("default_pg", [0, 1])}
USER = {"name": "step", "filename": "train.py", "line": 12}
TORCH = {"name": "all_reduce", "filename": "site-packages/torch/distributed/c10d.py", "line": 9}


def _shared_frames() -> list:
    es = collectives(300, last_state="started")
    frames = [[TORCH, dict(USER, line=line)] for line in (12, 13)]
    for i, e in enumerate(es):
        e["frames"] = frames[i % 2]  # two list objects shared by every entry (a memo-shared pickle)
    return es


def _many_pending() -> list:
    es = collectives(200)
    for e in es[100:]:
        e["retired"] = False  # 100 unretired, half of them completed: past the few looked at one by one
    for e in es[150:]:
        e["state"] = "scheduled"
    return es


COMMON = {
    "plain": lambda: collectives(50),
    "unfinished tail": lambda: collectives(50, last_state="started"),
    "gloo": lambda: collectives(40, lib="gloo", last_state="scheduled"),
    "frames": lambda: collectives(200, last_state="started", frames=[TORCH, USER]),
    "shared frames": _shared_frames,
    "many pending": _many_pending,
    "starts late": lambda: collectives(30, start=1000),
    "retired as numbers and None": lambda: [dict(e, retired=(1, 7, None, 0.0, "yes")[i % 5]) for i, e in
                                            enumerate(collectives(20))],
    "newest not retired (None)": lambda: [dict(e, retired=None if i == 19 else True) for i, e in
                                          enumerate(collectives(20, last_state="started"))],
    "newest retired as 2": lambda: [dict(e, retired=2 if i == 19 else True) for i, e in enumerate(collectives(20))],
    "one unretired, not the newest": lambda: [dict(e, retired=i != 7) for i, e in
                                              enumerate(collectives(20, last_state="started"))],
    "every one retired as 1": lambda: [dict(e, retired=1) for e in collectives(20)],
    "mixed ops": lambda: [entry(i, i + 1, op=("all_reduce", "broadcast", "all_gather")[i % 3], size=i % 5 + 1)
                          for i in range(60)],
}


@pytest.mark.parametrize("name", COMMON)
@pytest.mark.parametrize("world", [2, 16384], ids=["whole", "windowed"])
def test_the_common_dump_gives_the_entry_by_entry_trace(monkeypatch, name: str, world: int) -> None:
    data = dump(COMMON[name](), {"0": ("default_pg", list(range(world)))})
    assert compact_common(data["entries"], "", 512, []) is not None
    fast = build_trace(data, 1, "rank_1.pkl")
    monkeypatch.setattr(parse, "compact_common", lambda *args: None)
    assert build_trace(data, 1, "rank_1.pkl") == fast


def _set(field: str, value: object, index: int = 5):
    def make() -> list:
        es = collectives(10)
        es[index][field] = value
        return es
    return make


OTHERS = {
    "two groups": _set("process_group", ("1", "tp")),
    "p2p": _set("is_p2p", True),
    "repeated seq": _set("collective_seq_id", 5, index=5),
    "gap": _set("collective_seq_id", 60),
    "out of order": _set("collective_seq_id", 1, index=9),
    "seq 0": _set("collective_seq_id", 0, index=0),
    "float seq": _set("collective_seq_id", 7.0, index=6),
    "bool seq": _set("collective_seq_id", True, index=0),
    "float first seq": _set("collective_seq_id", 1.0, index=0),
    "float last seq": _set("collective_seq_id", 10.0, index=9),
    "str seq": _set("collective_seq_id", "6", index=5),
    "None seq": _set("collective_seq_id", None, index=5),
    "seq past int64": lambda: [dict(e, collective_seq_id=(1 << 63) + i) for i, e in enumerate(collectives(5))],
    "no retired": lambda: [{k: v for k, v in e.items() if k != "retired"} for e in collectives(5)],
    "name not str": _set("profiling_name", 3),
    "not a dict": lambda: collectives(3) + [["nccl:all_reduce"]],
}


@pytest.mark.parametrize("name", OTHERS)
def test_any_other_dump_is_left_to_the_entry_by_entry_path(name: str) -> None:
    assert compact_common(OTHERS[name](), "", 512, []) is None


def test_entries_sharing_a_frames_list_each_get_their_own_call_site() -> None:
    tail = callsite_tail(_shared_frames())
    assert len(tail) == CALLSITE_WINDOW
    assert tail[:4] == ("train.py:12 in step", "train.py:13 in step") * 2 and tail[-1] == "train.py:13 in step"
