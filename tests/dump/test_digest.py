"""What a digest keeps of a rank's dump, how big it is, and that expanding it gives the analyzer
the same view of the kept entries, call sites, stacks and context as the full dump."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from lightning_ncclx.analysis.load import read_context, read_stacks
from lightning_ncclx.analysis.parse import build_trace
from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.dump.digest import ENTRIES_PER_GROUP, MAX_ENTRIES_PER_GROUP, make_digest, member_runs
from lightning_ncclx.dump.digest_expand import expand_digest, members_text
from lightning_ncclx.events.wire import Announcement

DATA = Path(__file__).resolve().parents[1] / "data"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch"


def _entry(i: int, group: str = "0", *, p2p: bool = False, done: bool = True, seq: int | None = None,
           line: int = 10) -> dict:
    frames = [{"name": "all_reduce", "filename": f"{TORCH}/distributed/distributed_c10d.py", "line": 3068},
              {"name": "wrapper", "filename": f"{TORCH}/distributed/c10d_logger.py", "line": 83},
              {"name": "step", "filename": "/home/u/train.py", "line": line},
              {"name": "<module>", "filename": "/home/u/train.py", "line": 99}]
    return {"record_id": i, "pg_id": 0, "process_group": (group, "default_pg" if group == "0" else "tp"),
            "collective_seq_id": 0 if p2p else (i if seq is None else seq), "p2p_seq_id": i if p2p else 0,
            "op_id": i, "profiling_name": "nccl:send 0->1" if p2p else "nccl:all_reduce",
            "time_created_ns": 1_796_000_000_000_000_000 + i * 1_234_567, "input_sizes": [[4, 2]],
            "input_dtypes": ["Float"], "output_sizes": [[4, 2]], "output_dtypes": ["Float"],
            "state": "completed" if done else "scheduled", "retired": done, "is_p2p": p2p, "timeout_ms": 600000,
            "frames": frames}


def _dump(entries: list[dict], groups: dict | None = None) -> dict:
    return {"version": "2.10", "comm_lib_version": "2.28.9",
            "pg_config": groups or {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "entries": entries}


def _write_rank(folder: Path, rank: int, dump: dict, stacks: str = "", context: dict | None = None) -> list[Path]:
    trace = folder / f"rank_{rank:05d}.nccl.fr.pkl"
    trace.write_bytes(pickle.dumps(dump))
    ctx = folder / f"rank_{rank:05d}.context.json"
    ctx.write_text(json.dumps(context or {"rank": rank, "world_size": 4, "host": "node-1", "phase": "train_step",
                                          "step": 7, "pg_config": {"0": {"ranks": list(range(4))}}}))
    out = [trace, ctx]
    if stacks:
        out.append(folder / f"rank_{rank:05d}.stacks.txt")
        out[-1].write_text(stacks)
    return out


def _expanded(files: list[Path], rank: int, world_size: int = 4) -> dict[str, bytes]:
    return expand_digest(make_digest(files), rank, world_size)


def test_each_group_keeps_its_newest_entries_in_file_order_reaching_back_to_its_newest_finished_one(tmp_path):
    entries = [_entry(i, "0" if i % 3 else "1", p2p=i % 7 == 0) for i in range(60)]
    entries += [_entry(60 + i, "0", done=False, seq=60 + i) for i in range(10)]  # queued ahead of the device
    entries += [_entry(70 + i, "1", done=False, seq=70 + i) for i in range(30)]  # more than the cap
    files = _write_rank(tmp_path, 1, _dump(entries))
    kept = safe_loads(_expanded(files, 1)["rank_00001.nccl.fr.pkl"])["entries"]
    by_lane: dict = {}
    for e in kept:
        by_lane.setdefault((e["process_group"][0], e["is_p2p"]), []).append(e)
    originals = {lane: [e for e in entries if (e["process_group"][0], e["is_p2p"]) == lane] for lane in by_lane}
    assert {lane: len(v) for lane, v in by_lane.items()} == {
        ("0", False): 11, ("1", False): MAX_ENTRIES_PER_GROUP, ("0", True): ENTRIES_PER_GROUP,
        ("1", True): 3}  # p2p in group 1: entries 0, 21 and 42 only
    for lane, got in by_lane.items():
        assert [e["collective_seq_id"] for e in got] == [e["collective_seq_id"] for e in originals[lane][-len(got):]]
        assert [e["p2p_seq_id"] for e in got] == [e["p2p_seq_id"] for e in originals[lane][-len(got):]]
    assert by_lane[("0", False)][0]["retired"] and not by_lane[("0", False)][1]["retired"]  # the frontier is kept
    times = [e["time_created_ns"] for e in kept]
    assert times == sorted(times)  # file order across groups
    for e in kept:  # to the microsecond
        assert abs(e["time_created_ns"] - entries[e["p2p_seq_id"] or e["collective_seq_id"]]["time_created_ns"]) <= 500


def test_the_analyzer_reads_the_same_ops_states_sizes_and_call_sites_from_the_digest(tmp_path):
    entries = [_entry(i, line=10 + i % 3) for i in range(40)] + [_entry(40, done=False, line=11)]
    files = _write_rank(tmp_path, 2, _dump(entries))
    digest = safe_loads(_expanded(files, 2)["rank_00002.nccl.fr.pkl"])
    full = build_trace(_dump(entries[-len(digest["entries"]):]), 2, "full")
    small = build_trace(digest, 2, "digest")
    track, small_track = full.groups["0"], small.groups["0"]
    assert list(small_track.seqs) == list(track.seqs) and small_track.done == track.done
    assert small_track.sig_table == track.sig_table and list(small_track.sig_ids) == list(track.sig_ids)
    assert small_track.callsite_tail == track.callsite_tail
    assert [o.seq for o in small.open_ops] == [o.seq for o in full.open_ops] == [40]
    assert small.open_ops[0].frames == ("/home/u/train.py:11 in step",)  # the call site shown for an open op
    assert small.pg_config == full.pg_config == {"0": ("default_pg", (0, 1, 2, 3))}
    assert (small.version, small.comm_lib_version, small.lib) == (full.version, full.comm_lib_version, full.lib)


def test_member_lists_travel_as_runs_and_come_back_as_torch_writes_them():
    assert member_runs(range(16384)) == [[0, 16384, 1]]
    assert member_runs([0, 8, 16, 24, 3, 4, 5]) == [[0, 4, 8], [3, 3, 1]]
    assert member_runs([5]) == [[5, 1, 1]]
    assert member_runs(range(0, 400, 3)) == [[0, 134, 3]]
    assert member_runs([i * i for i in range(200)]) is None  # past MAX_MEMBER_RUNS: left out
    assert members_text(((0, 3, 1), (8, 2, 2))) == str([0, 1, 2, 8, 10])


def test_a_16384_rank_group_and_a_strided_one_stay_a_few_bytes_and_are_declared_exactly(tmp_path):
    world = 16384
    groups = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))},
              "1": {"name": "1", "desc": "dp", "ranks": str(list(range(3, world, 8)))}}
    files = _write_rank(tmp_path, 3, _dump([_entry(i) for i in range(5)], groups),
                        context={"rank": 3, "world_size": world, "host": "node-0"})
    raw = make_digest(files)
    assert len(raw) < 1500, len(raw)
    config = safe_loads(expand_digest(raw, 3, world)["rank_00003.nccl.fr.pkl"])["pg_config"]
    assert config == groups


def test_the_digest_of_a_2000_entry_h200_dump_announces_in_about_300_bytes(tmp_path):
    (tmp_path / "rank_00000.nccl.fr.pkl").write_bytes((DATA / "nccl-h200" / "ws1_2000_entries.pkl").read_bytes())
    context = {"rank": 0, "world_size": 16384, "pg_config": {"0": {"ranks": list(range(16384))}},
               "flight_recorder": {"TORCH_FR_BUFFER_SIZE": "20000"}, "phase": "train_step", "host": "node-0001"}
    (tmp_path / "rank_00000.context.json").write_text(json.dumps(context))
    other = "--- thread 'ncclx-watchdog-rank0' (id 2) ---\n" + '  File "w.py", line 1, in run\n' * 500
    (tmp_path / "rank_00000.stacks.txt").write_text(
        other + "--- thread 'MainThread' (id 1) ---\n  File \"train.py\", line 9, in step\n")
    files = sorted(tmp_path.iterdir())
    announcement = Announcement(0, "node-0001", tuple(p.name for p in files), "/scratch/run/ncclx_dumps/stall-001",
                                make_digest(files))
    sent = announcement.encode()
    full = sum(p.stat().st_size for p in files)
    assert len(sent) < 512 < full // 1000, (len(sent), full)
    expanded = expand_digest(Announcement.parse(0, sent).digest or b"", 0, 16384)
    assert sorted(expanded) == sorted(p.name for p in files)
    ctx = json.loads(expanded["rank_00000.context.json"])
    assert ctx["digest"] is True and ctx["phase"] == "train_step" and "pg_config" not in ctx
    assert ctx["trace_files"] == ["rank_00000.nccl.fr.pkl"] and ctx["stacks_file"] == "rank_00000.stacks.txt"


def test_the_stacks_file_gives_the_analyzer_the_same_user_frame_and_wait(tmp_path):
    main = ["/usr/lib/python3.11/runpy.py", "/home/u/train.py", "/opt/venv/lib/python3.11/site-packages/lightning/"
            "pytorch/loops/fit_loop.py", "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py",
            "/usr/lib/python3.11/queue.py", "/usr/lib/python3.11/threading.py"]
    text = ("--- thread 'ncclx-watchdog' (id 2) ---\n  File \"/home/u/other.py\", line 5, in spin\n"
            "\n--- thread 'MainThread' (id 1) ---\n"
            + "".join(f'  File "{f}", line {10 + i}, in fn{i}\n    code()\n' for i, f in enumerate(main)))
    files = _write_rank(tmp_path, 1, _dump([_entry(0)]), stacks=text)
    out = tmp_path / "out"
    out.mkdir()
    for name, data in _expanded(files, 1).items():
        (out / name).write_bytes(data)
    assert read_stacks(out / "rank_00001.stacks.txt") == read_stacks(files[2]) == (
        "/home/u/train.py:11 in fn1",
        "waiting for the data loader: /opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:13 in fn3")
    assert len((out / "rank_00001.stacks.txt").read_text().splitlines()) == 3


def test_the_context_keeps_its_scalar_fields_and_takes_rank_and_size_from_the_summarizer(tmp_path):
    context = {"rank": 1, "world_size": 99999, "host": "node-7", "phase": "validation", "step": 12, "event": "stall-002",
               "exception": "RuntimeError: x" * 100, "pg_config": {"0": {"ranks": [0, 1]}}, "cuda_memory": {"a": 1}}
    files = _write_rank(tmp_path, 1, _dump([_entry(0)]), context=context)
    (tmp_path / "expanded.json").write_bytes(_expanded(files, 1)["rank_00001.context.json"])
    ctx = read_context(tmp_path / "expanded.json", 1)
    assert (ctx.host, ctx.phase, ctx.step, ctx.event, ctx.world_size) == ("node-7", "validation", 12, "stall-002", 4)
    assert ctx.exception == context["exception"][:512]


def test_a_file_that_cannot_be_cut_down_is_left_out(tmp_path):
    bad = tmp_path / "rank_00001.nccl.fr.pkl"
    bad.write_bytes(b"\x80\x04not a pickle")
    ctx = tmp_path / "rank_00001.context.json"
    ctx.write_text(json.dumps({"rank": 1, "phase": "train_step"}))
    assert sorted(expand_digest(make_digest([bad, ctx]), 1, 4)) == ["rank_00001.context.json"]
