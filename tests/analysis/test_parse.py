"""parse: one decoded dump -> RankTrace. Group membership strings (``parse_ranks``), ``pg_config``
rows, the top-level checks of ``build_trace``, the backend name, sequence ordering, coalesced slots,
point-to-point names and open ops; hostile values end in a DumpReadError that says why."""

from __future__ import annotations

import pytest
from synth import T0, collectives, dump, entry

from lightning_ncclx.analysis.parse import (MAX_RANK, build_trace, check_entry_types, parse_pg_config,
                                            parse_ranks)
from lightning_ncclx.errors import DumpReadError

WORLD2 = {"0": ("default_pg", [0, 1])}


def _trace(entries: list, groups: dict | None = None, rank: int = 0, hint: str = ""):
    return build_trace(dump(entries, WORLD2 if groups is None else groups), rank, f"rank_{rank}.pkl", hint)


def _refused(data) -> str:
    with pytest.raises(DumpReadError) as err:
        build_trace(data, 0, "x")
    return str(err.value)


# --- parse_ranks -------------------------------------------------------------------------------

@pytest.mark.parametrize("value, ranks", [
    ("[0, 1, 2]", (0, 1, 2)), (" [3, 1] ", (3, 1)), ("[]", ()), ([4, 2], (4, 2)), ((7,), (7,)), ([], ()),
    ([MAX_RANK - 1], (MAX_RANK - 1,)),
])
def test_parse_ranks_reads_torchs_string_and_lists(value, ranks):
    assert parse_ranks(value) == ranks


@pytest.mark.parametrize("value", [
    [-1], [MAX_RANK], "[0, -2]", f"[{MAX_RANK}]", [True, False], [1.0], [float("nan")], [10**30], ["0"],
    "0, 1", "", None, 5, {"0": 1}, [[0, 1]],
])
def test_parse_ranks_refuses_malformed_members(value):
    assert parse_ranks(value) is None


def test_parse_ranks_refuses_a_list_with_more_members_than_max_rank():
    assert parse_ranks([0] * (MAX_RANK + 1)) is None
    assert parse_ranks("[" + "1," * (16 * MAX_RANK) + "]") is None  # too long a string to even scan


@pytest.mark.parametrize("value", ["[0, 1.5]", "[0, x, 2]", "[1e3]"])
def test_parse_ranks_refuses_non_integer_members_in_a_string(value):
    assert parse_ranks(value) is None

def test_parse_ranks_refuses_a_string_with_more_members_than_max_rank():
    assert parse_ranks("[" + "0," * (MAX_RANK + 1) + "]") is None


# --- parse_pg_config ---------------------------------------------------------------------------

def test_pg_config_rows_by_name_with_the_key_as_fallback_name():
    raw = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
           "k": {"desc": "tp", "ranks": [1]},  # no name: the key
           "n": {"name": 7, "ranks": "[0]"}}  # int name, no desc
    assert parse_pg_config(raw) == {"0": ("default_pg", (0, 1)), "k": ("tp", (1,)), "7": ("", (0,))}


def test_pg_config_skips_glooS_empty_key_and_malformed_rows():
    raw = {"": {"name": "", "desc": "undefined", "ranks": "[0, 1]"},  # gloo's raw pg_config
           "a": "not a dict", "b": {"name": ["x"], "ranks": "[0]"}, "c": {"desc": {"d": 1}, "ranks": "[0]"},
           "d": {"name": "d", "ranks": "[0, -1]"}, "e": {"name": "e"}, "ok": {"name": "ok", "ranks": "[2]"}}
    assert parse_pg_config(raw) == {"ok": ("", (2,))}


def test_pg_config_names_and_descs_are_cut_to_200_characters():
    out = parse_pg_config({"x": {"name": "n" * 500, "desc": "d" * 500, "ranks": "[0]"}})
    ((name, (desc, _)),) = out.items()
    assert len(name) == 200 and len(desc) == 200


@pytest.mark.parametrize("raw", [None, [], "pg", 3])
def test_pg_config_of_another_type_is_empty(raw):
    assert parse_pg_config(raw) == {}


# --- build_trace: top level --------------------------------------------------------------------

@pytest.mark.parametrize("data, why", [
    ([], "not a flight-recorder dump: top level is list, not dict"),
    ({"version": 2.1, "entries": []}, "not a flight-recorder dump: 'version' is float, not a string"),
    ({"entries": []}, "not a flight-recorder dump: no 'version' key"),
    ({"version": "1.9", "entries": []}, "unsupported flight-recorder format version '1.9' (2.x expected)"),
    ({"version": "2.10", "entries": "[]"}, "'entries' is str, not a list"),
])
def test_what_is_not_a_dump_is_refused_with_the_reason(data, why):
    assert _refused(data) == why


def test_a_dump_without_entries_is_an_empty_trace():
    t = build_trace({"version": "2.10", "comm_lib_version": 2.28}, 3, "p")
    assert (t.rank, t.lib, t.n_entries, t.newest_ns) == (3, "unknown", 0, 0)
    assert t.groups == {} and t.p2p == () and t.open_ops == () and t.comm_lib_version == ""


def test_check_entry_types_returns_the_names_and_counts_bad_entries():
    es = collectives(2)
    assert check_entry_types(es) == ["nccl:all_reduce", "nccl:all_reduce"]
    with pytest.raises(DumpReadError, match=r"1 of 3 entries .*\(entry 2: entry is list, not a dict\)"):
        check_entry_types(es + [["x"]])
    nameless = collectives(3)
    del nameless[0]["profiling_name"]
    with pytest.raises(DumpReadError, match=r"1 of 3 entries .*\(entry 0: profiling_name is missing\)"):
        check_entry_types(nameless)


@pytest.mark.parametrize("field, value", [
    ("collective_seq_id", 2**70),  # fits no int64 column
    ("time_created_ns", float("nan")), ("time_created_ns", 2**70),
])
def test_numbers_no_column_can_hold_make_the_dump_unreadable(field, value):
    es = collectives(3)
    es[1][field] = value
    assert _refused(dump(es, WORLD2)).startswith("malformed entry")


def test_a_p2p_seq_id_of_the_wrong_type_is_named():
    e = entry(3, 0, "send 0->1", p2p_seq=1, is_p2p=True)
    e["p2p_seq_id"] = "1"
    assert "p2p_seq_id is str" in _refused(dump(collectives(3) + [e], WORLD2))


# --- build_trace: content ----------------------------------------------------------------------

def test_the_backend_is_the_entries_prefix_or_the_hint_when_they_mix():
    assert _trace(collectives(2, lib="nccl2")).lib == "nccl2"
    mixed = collectives(2) + [entry(2, 3, lib="nccl2")]
    assert _trace(mixed).lib == "nccl+nccl2"
    assert _trace(mixed, hint="nccl2").lib == "nccl2"
    assert _trace(collectives(2, lib="gloo"), hint="nccl").lib == "gloo"  # one prefix beats the hint


def test_entries_out_of_order_are_sorted_with_their_done_flags_and_times():
    es = collectives(4, last_state="started")  # seq 4 unfinished
    track = _trace(es[::-1]).groups["0"]
    assert list(track.seqs) == [1, 2, 3, 4]
    assert track.done == b"\x01\x01\x01\x00"
    assert list(track.times_ns) == [T0, T0 + 1000, T0 + 2000, T0 + 3000]


def test_groups_are_split_by_process_group_and_keep_their_desc():
    groups = {"0": ("default_pg", [0, 1]), "5": ("tp", [0, 1])}
    es = collectives(2) + [entry(2, 1, pg=("5", "tp" * 200), size=8)]
    t = _trace(es, groups)
    assert sorted(t.groups) == ["0", "5"]
    assert list(t.groups["5"].seqs) == [1] and t.groups["5"].sig(0)[1] == ((8,),)
    assert len(t.groups["5"].desc) == 200
    assert t.pg_config == {"0": ("default_pg", (0, 1)), "5": ("tp", (0, 1))}


def test_coalesced_entries_sharing_a_sequence_id_merge_into_one_slot():
    tail = entry(4, 3, "coalesced", state="scheduled")
    tail["input_sizes"] = tail["output_sizes"] = []
    tail["input_dtypes"] = tail["output_dtypes"] = []
    es = collectives(2) + [entry(2, 3, size=4), entry(3, 3, size=8), tail]
    track = _trace(es).groups["0"]
    assert list(track.seqs) == [1, 2, 3]
    assert track.sig(2) == ("all_reduce", ((4,), (8,)), ("Float", "Float"), ((4,), (8,)), ("Float", "Float"))
    assert track.done == b"\x01\x01\x00"  # one unfinished part leaves the slot unfinished
    assert list(track.times_ns) == [T0, T0 + 1000, T0 + 2000]  # the slot's first entry's time


def test_different_ops_coalesced_under_one_sequence_id_are_named_together():
    es = collectives(1) + [entry(1, 2), entry(2, 2, "broadcast")]
    assert _trace(es).groups["0"].sig(1)[0] == "all_reduce+broadcast"


@pytest.mark.parametrize("name, op, src, dst", [
    ("send 0->1", "send", 0, 1), ("recv 1<-0", "recv", 0, 1), ("recv 0->1", "recv", 0, 1),
    ("recv ?->1", "recv", -1, 1), ("send 2 -> 3", "send", 2, 3), ("send", "send", -1, -1),
    ("batch_isend_irecv x", "batch_isend_irecv", -1, -1),
])
def test_p2p_profiling_names_give_source_and_destination(name, op, src, dst):
    e = entry(2, 0, name, p2p_seq=5, is_p2p=True, state="scheduled")
    (p,) = _trace(collectives(2) + [e]).p2p
    assert (p.op, p.src, p.dst, p.seq, p.done, p.group) == (op, src, dst, 5, False, "0")


def test_p2p_done_is_retired_on_gloo_and_completed_or_retired_elsewhere():
    def done(lib: str, state: str, retired: bool) -> bool:
        e = entry(2, 0, "send 0->1", lib=lib, p2p_seq=1, is_p2p=True, state=state)
        e["retired"] = retired
        return _trace(collectives(2, lib=lib) + [e]).p2p[0].done

    assert done("gloo", "completed", False) is False and done("gloo", "scheduled", True) is True
    assert done("nccl", "completed", False) is True and done("nccl", "scheduled", True) is True
    assert done("nccl", "started", False) is False


def test_p2p_sizes_are_the_inputs_else_the_outputs():
    e = entry(2, 0, "recv 1<-0", p2p_seq=1, is_p2p=True, size=6, dtype="Half")
    e["input_sizes"], e["input_dtypes"] = [], []
    (p,) = _trace(collectives(2) + [e]).p2p
    assert p.sizes == ((6,),) and p.dtypes == ("Half",)


def test_an_old_style_p2p_entry_is_found_by_its_sequence_ids():
    e = entry(2, 0, "send 0->1", p2p_seq=3)  # is_p2p False: collective seq 0 with a p2p seq is p2p
    t = _trace(collectives(2) + [e])
    assert [p.seq for p in t.p2p] == [3] and list(t.groups["0"].seqs) == [1, 2]


def test_open_ops_name_the_unfinished_entries_with_their_frames():
    frames = [{"name": "all_reduce", "filename": "site-packages/torch/distributed/c10d.py", "line": 9},
              {"name": "step", "filename": "train.py", "line": 12}]
    es = collectives(3, last_state="started", frames=frames)
    es.append(entry(3, 0, "send 0->1", p2p_seq=4, is_p2p=True, state="scheduled"))
    t = _trace(es)
    coll, p2p = t.open_ops
    assert (coll.op, coll.seq, coll.is_p2p, coll.state, coll.group, coll.desc) == (
        "all_reduce", 3, False, "started", "0", "default_pg")
    assert coll.frames == ("site-packages/torch/distributed/c10d.py:9 in all_reduce", "train.py:12 in step")
    assert (p2p.op, p2p.seq, p2p.is_p2p) == ("send 0->1", 4, True)


def test_newest_time_counts_p2p_entries_and_comm_lib_version_is_cut():
    es = collectives(2) + [entry(2, 0, "send 0->1", p2p_seq=1, is_p2p=True, t_ns=T0 + 10**9)]
    data = dump(es, WORLD2)
    data["comm_lib_version"] = "v" * 300
    t = build_trace(data, 1, "p")
    assert t.newest_ns == T0 + 10**9 and t.n_entries == 3 and len(t.comm_lib_version) == 100
