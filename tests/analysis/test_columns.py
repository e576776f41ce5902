"""The C-level column extraction gives what the per-entry ``dict.get`` reading would."""

from __future__ import annotations

import os
import subprocess
import sys

from synth import collectives, dump, entry, write

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.analysis.columns import canonical_sig, done_column, sig_columns, sig_id, time_column
from lightning_ncclx.analysis.parse import build_trace


def test_signature_ids_are_equal_for_equal_signatures_whatever_the_raw_form():
    a = entry(0, 1, size=4)
    b = dict(entry(1, 2, size=4), profiling_name="nccl2:all_reduce", input_sizes=((4,),))  # tuple vs list, other lib
    c = entry(2, 3, size=8)
    ids, table = sig_columns([a, b, c])
    assert ids[0] == ids[1] != ids[2]
    assert table[ids[0]] == ("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))


def test_signatures_this_process_decoded_before_give_the_same_ids_and_table(monkeypatch):
    from lightning_ncclx.analysis import columns

    es = [entry(0, i + 1, size=4 << (i % 3)) for i in range(9)]
    monkeypatch.setattr(columns, "_KNOWN_SIGS", {})
    cold = sig_columns(es)
    assert len(columns._KNOWN_SIGS) == 3
    warm = sig_columns([dict(e) for e in es])  # other objects, same values: answered from what was learned
    assert cold == warm and list(cold[0]) == [sig_id(canonical_sig(e)) for e in es]
    assert cold[1] == {sig_id(canonical_sig(e)): canonical_sig(e) for e in es}


def test_what_this_process_learns_of_signatures_stays_bounded(monkeypatch):
    from lightning_ncclx.analysis import columns

    monkeypatch.setattr(columns, "_KNOWN_SIGS", {})
    monkeypatch.setattr(columns, "_KNOWN_MAX", 4)
    for size in range(10):
        sig_columns([entry(0, 1, size=size + 1)])
        assert len(columns._KNOWN_SIGS) == size % 4 + 1  # full at 4: cleared, then the new key kept
    long = dict(entry(0, 1), input_dtypes=["x" * 600])  # a key past _KNOWN_KEY_BYTES is decoded, not kept
    ids, table = sig_columns([long])
    assert table[ids[0]][2] == ("x" * columns.NAME_CHARS,) and len(columns._KNOWN_SIGS) <= 4
    assert not any(len(k) > columns._KNOWN_KEY_BYTES for k in columns._KNOWN_SIGS)


def test_an_entry_whose_signature_is_refused_is_refused_again_not_learned(monkeypatch):
    from lightning_ncclx.analysis import columns

    monkeypatch.setattr(columns, "_KNOWN_SIGS", {})
    bad = dict(entry(0, 1), input_sizes=[[1, [2]]])  # nests too deep
    for _ in range(2):
        try:
            sig_columns([bad])
        except ValueError:
            pass
        else:
            raise AssertionError("a size nested three levels deep was accepted")
    assert columns._KNOWN_SIGS == {}


def _rooted(op: str, rank: int, root: int, size: int = 4) -> dict:
    e = entry(rank, 1, op=op, size=size)
    if op == "gather" and rank != root:
        e["output_sizes"], e["output_dtypes"] = [], []
    if op == "scatter" and rank != root:
        e["input_sizes"], e["input_dtypes"] = [], []
    return e


def test_rank_dependent_fields_are_left_out_of_signatures():
    for op in ("gather", "scatter"):
        root, other = _rooted(op, 0, 0), _rooted(op, 1, 0)
        root["output_sizes" if op == "gather" else "input_sizes"] = [[3, 4]]
        assert sig_id(canonical_sig(root)) == sig_id(canonical_sig(other)), op
    a2a = [dict(entry(r, 1, op="all_to_all"), input_sizes=[[r + 3]]) for r in range(3)]
    assert len({sig_id(canonical_sig(e)) for e in a2a}) == 1
    assert canonical_sig(a2a[0]) == ("all_to_all", (), ("Float",), (), ("Float",))


def test_what_every_rank_of_a_rooted_collective_sends_is_still_compared():
    assert canonical_sig(_rooted("gather", 1, 0, size=4)) != canonical_sig(_rooted("gather", 2, 0, size=2))
    assert canonical_sig(_rooted("scatter", 1, 0, size=4)) != canonical_sig(_rooted("scatter", 2, 0, size=2))
    assert canonical_sig(entry(0, 1, op="all_to_all", dtype="Float")) != canonical_sig(
        entry(1, 1, op="all_to_all", dtype="BFloat16"))


def test_missing_fields_take_the_slow_path_with_the_same_meaning():
    full = entry(0, 1)
    full["input_sizes"] = []
    partial = entry(1, 2)
    del partial["input_sizes"], partial["state"]  # missing: [] and not completed
    partial["retired"] = False
    ids, table = sig_columns([full, partial])
    assert ids[0] == ids[1] and table[ids[0]] == canonical_sig(full)
    assert done_column([full, partial], "nccl") == b"\x01\x00"
    assert done_column([full, partial], "gloo") == b"\x01\x00"


def test_none_times_read_as_zero():
    es = [entry(0, 1, t_ns=5), dict(entry(1, 2), time_created_ns=None)]
    assert list(time_column(es)) == [5, 0]


def test_signature_ids_are_stable_across_processes():
    sig = ("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))
    code = ("from lightning_ncclx.analysis.columns import sig_id; "
            "print(sig_id(('all_reduce', ((4,),), ('Float',), ((4,),), ('Float',))))")
    env = dict(os.environ, PYTHONHASHSEED="12345")  # not Python's randomized hash()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert int(out) == sig_id(sig)


def test_tracks_keep_only_the_newest_call_sites():
    frames = [{"name": "step", "filename": "train.py", "line": 7}]
    trace = build_trace(dump(collectives(200, frames=frames), {"0": ("default_pg", [0])}), 0, "x")
    track = trace.groups["0"]
    assert len(track.callsite_tail) == 128 and len(track.callsites) == 200
    assert track.callsites[0] is None and track.callsites[-1] == "train.py:7 in step"
    assert bytes(track.done) == b"\x01" * 200 and list(track.seqs) == list(range(1, 201))


def test_messages_show_sizes_as_documented(tmp_path):
    for r in range(3):
        es = collectives(4, last_state="started")
        if r == 2:
            es[1]["profiling_name"] = "nccl:broadcast"
        write(tmp_path, f"nccl_trace_rank_{r}", dump(es, {"0": ("default_pg", [0, 1, 2])}))
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.OP_MISMATCH and s.culprit_ranks == (2,)
    assert "called broadcast[4]/Float at seq 2" in s.headline and "others called all_reduce[4]/Float" in s.headline
