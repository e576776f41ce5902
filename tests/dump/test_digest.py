"""What a digest keeps of a rank's dump, and how big it is."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.events.packing import pack_named, unpack
from lightning_ncclx.dump.digest import (
    ENTRIES_PER_GROUP, FRAMES_PER_GROUP, HASHED_MEMBERS_PREFIX, digest_files, known_members, main_thread_stack,
    restore_members, trim_trace,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _entry(i: int, group: str, p2p: bool = False) -> dict:
    return {"record_id": i, "process_group": (group, "g"), "collective_seq_id": i, "is_p2p": p2p,
            "profiling_name": "gloo:all_reduce", "frames": [{"name": "f", "filename": "x.py", "line": i}]}


def test_the_newest_entries_of_each_group_are_kept_in_order_with_frames_on_the_newest_few() -> None:
    entries = [_entry(i, "0" if i % 3 else "1", p2p=i % 7 == 0) for i in range(60)]
    out = trim_trace({"entries": entries, "pg_config": {}})["entries"]
    by_group: dict = {}
    for e in out:
        by_group.setdefault((e["process_group"][0], e["is_p2p"]), []).append(e)
    assert {k: len(v) for k, v in by_group.items()} == {("0", False): ENTRIES_PER_GROUP, ("1", False): ENTRIES_PER_GROUP,
                                                         ("0", True): 6, ("1", True): 3}
    assert [e["record_id"] for e in out] == sorted(e["record_id"] for e in out)
    for group in by_group.values():
        newest = [e["record_id"] for e in group][-FRAMES_PER_GROUP:]
        assert all(bool(e["frames"]) == (e["record_id"] in newest) for e in group)
        assert group[-1]["record_id"] == max(e["record_id"] for e in entries
                                             if (e["process_group"][0], e["is_p2p"]) == (group[0]["process_group"][0],
                                                                                         group[0]["is_p2p"]))


def test_long_member_lists_travel_as_a_hash_and_come_back_from_the_summarizers_own_dump() -> None:
    big = str(list(range(4096)))
    trace = {"entries": [], "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": big},
                                          "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}}
    digest = trim_trace(trace)
    assert digest["pg_config"]["0"]["ranks"].startswith(HASHED_MEMBERS_PREFIX)
    assert digest["pg_config"]["1"]["ranks"] == "[0, 1]"
    assert len(pickle.dumps(digest)) < 1000
    assert restore_members(digest, known_members([trace]))["pg_config"] == trace["pg_config"]
    unknown = restore_members(digest, {})["pg_config"]["0"]["ranks"]
    assert unknown == "[]"  # the analyzer then takes the group's members from the dumps it has


def test_the_digest_of_a_2000_entry_nccl_dump_is_a_few_kib(tmp_path: Path) -> None:
    source = DATA / "nccl-h200" / "ws1_2000_entries.pkl"
    (tmp_path / "rank_00000.nccl.fr.pkl").write_bytes(source.read_bytes())
    context = {"rank": 0, "world_size": 16384, "pg_config": {"0": {"ranks": list(range(16384))}},
               "flight_recorder": {"TORCH_FR_BUFFER_SIZE": "20000"}, "phase": "train_step"}
    (tmp_path / "rank_00000.context.json").write_text(json.dumps(context))
    other = "--- thread 'ncclx-watchdog-rank0' (id 2) ---\n" + "  File \"w.py\", line 1, in run\n" * 500
    (tmp_path / "rank_00000.stacks.txt").write_text(
        other + "--- thread 'MainThread' (id 1) ---\n  File \"train.py\", line 9, in step\n")
    files = sorted(tmp_path.iterdir())
    digest = digest_files(files)
    assert sorted(digest) == [p.name for p in files]
    blob = pack_named(digest)
    full = sum(p.stat().st_size for p in files)
    assert len(blob) < 4096 < full / 50, (len(blob), full)
    trace = safe_loads(digest["rank_00000.nccl.fr.pkl"])
    original = safe_loads(source.read_bytes())
    assert trace["entries"] == [dict(e, frames=[]) if e not in original["entries"][-FRAMES_PER_GROUP:] and e.get("frames")
                                else e for e in original["entries"][-len(trace["entries"]):]]
    ctx = json.loads(digest["rank_00000.context.json"])
    assert "pg_config" not in ctx and ctx["digest"] is True and ctx["phase"] == "train_step"
    assert digest["rank_00000.stacks.txt"].decode().startswith("--- thread 'MainThread'")
    out = unpack(blob, tmp_path / "out", inside=tmp_path)
    assert sorted(p.name for p in out.written) == sorted(digest)


def test_main_thread_stack_without_a_main_thread_keeps_the_start() -> None:
    assert main_thread_stack("x" * 20000) == "x" * 8192


def test_a_file_that_cannot_be_cut_down_is_left_out(tmp_path: Path) -> None:
    bad = tmp_path / "rank_00001.gloo.fr.pkl"
    bad.write_bytes(gzip.compress(b"not a pickle"))
    good = tmp_path / "rank_00001.stacks.txt"
    good.write_text("--- thread 'MainThread' (id 1) ---\n")
    assert list(digest_files([bad, good])) == ["rank_00001.stacks.txt"]
