"""Odd but possible dump sets never crash the analyzer or the reports (seeded, reproducible).

Each case: 1-6 ranks, up to 3 groups with random members, per rank a random window of each
group's sequence ids (wrapped buffers, gaps, a rank with none), random ops/sizes/states, some
p2p entries, some coalesced (repeated) sequence ids, and some entries with fields missing.

Each property runs on ``ROUNDS`` seeds (the healthy one, cheap, on 100); set
``NCCLX_FUZZ_ROUNDS`` for a longer search (e.g. 2000).
"""

from __future__ import annotations

import os
import random

import pytest
from synth import T0, dump, entry, write

from lightning_ncclx.analysis import Verdict, analyze_folder
from lightning_ncclx.report import render_html, render_json, render_markdown, render_text

OPS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "gather", "scatter", "all_to_all", "barrier",
       "coalesced", "_all_gather_base")
STATES = ("scheduled", "started", "completed")
ROUNDS = int(os.environ.get("NCCLX_FUZZ_ROUNDS", "75"))
"""Cases of each property over odd dump sets (seeds 0 .. ROUNDS-1 of its own range)."""
FEWER_ROUNDS = max(1, ROUNDS * 2 // 5)
"""Cases of the properties that rebuild every case in a second layout (context files, JSON)."""


def _case(rng: random.Random, folder) -> None:
    world = rng.randint(1, 6)
    groups = {"0": ("default_pg", list(range(world)))}
    for g in range(1, rng.randint(1, 3)):
        members = sorted(rng.sample(range(world), rng.randint(1, world)))
        groups[str(g)] = (rng.choice(("sub", "undefined", "")), members)
    lib = rng.choice(("nccl", "nccl2", "gloo"))
    for rank in range(world):
        if rng.random() < 0.1:
            continue  # no dump from this rank
        entries, rid = [], 0
        for name, (desc, members) in groups.items():
            if rank not in members or rng.random() < 0.15:
                continue  # nothing of this group left in this rank's buffer
            start = rng.choice((1, 1, rng.randint(1, 50)))
            for seq in range(start, start + rng.randint(1, 15)):
                for _ in range(2 if rng.random() < 0.05 else 1):  # coalesced: a repeated seq id
                    e = entry(rid, seq, rng.choice(OPS), lib=lib, pg=(name, desc), size=rng.choice((1, 4, 8)),
                              state=rng.choice(STATES), t_ns=T0 + rng.randint(0, 10**9))
                    if rng.random() < 0.05:
                        del e[rng.choice(("input_sizes", "state", "time_created_ns", "frames", "retired"))]
                    entries.append(e)
                    rid += 1
            if rng.random() < 0.2:
                peer = rng.randrange(len(members))
                op = rng.choice((f"send {peer}->{(peer + 1) % len(members)}", f"recv {peer}<-{(peer + 1) % len(members)}"))
                entries.append(entry(rid, 0, op, lib=lib, pg=(name, desc), is_p2p=True, p2p_seq=rng.randint(1, 5),
                                     state=rng.choice(STATES)))
                rid += 1
        rng.shuffle(entries) if rng.random() < 0.1 else None
        write(folder, f"nccl_trace_rank_{rank}", dump(entries, groups))


@pytest.mark.parametrize("seed", range(ROUNDS))
def test_random_dump_sets_are_analyzed_and_rendered_without_error(tmp_path, seed):
    rng = random.Random(seed)
    _case(rng, tmp_path)
    if not any(tmp_path.iterdir()):
        return
    s = analyze_folder(tmp_path)
    assert isinstance(s.verdict, Verdict)
    for render in (render_text, render_json, render_markdown, render_html):
        assert render(s)
    if s.verdict in (Verdict.NO_HANG, Verdict.STALLED):  # no rank is the odd one
        assert not s.findings and s.culprit_ranks == ()
    else:
        assert s.culprit_ranks and set(s.culprit_ranks) <= set(range(7))
    _culprits_are_members(s)


def _culprits_are_members(s) -> None:
    """Property: every finding blames members of the group it is about, and the headline
    finding's group and culprits are the summary's."""
    for f in s.findings:
        assert set(f.ranks) <= set(f.group.ranks), f
        assert not set(f.ranks) & set(f.waiting_ranks) or f.confidence == "low", f
    if s.findings:
        assert s.culprit_ranks == s.findings[0].ranks and s.process_group == s.findings[0].group


def _healthy_case(rng: random.Random, folder) -> None:
    """Every member of every group records the same calls, all finished, valid sizes for each op;
    ring buffers wrapped at different points; completed send/recv pairs; odd file names."""
    world = rng.randint(1, 6)
    groups = {"0": ("default_pg", list(range(world)))}
    for g in range(1, rng.randint(1, 3)):
        groups[str(g)] = (rng.choice(("sub", "")), sorted(rng.sample(range(world), rng.randint(1, world))))
    calls = {name: [] for name in groups}
    for name, (desc, members) in groups.items():
        n = len(members)
        for _ in range(rng.randint(1, 12)):
            k = rng.choice((1, 2, 4))
            op, ins, outs = rng.choice((("all_reduce", [[k]], [[k]]), ("broadcast", [[k]], [[k]]),
                                        ("all_gather", [[k]], [[k]] * n), ("_all_gather_base", [[k]], [[k * n]]),
                                        ("reduce_scatter", [[k * n]], [[k]]), ("barrier", [[1]], [[1]])))
            calls[name].append((op, ins, outs))
    lib = rng.choice(("nccl", "nccl2", "gloo"))
    for rank in range(world):
        entries, rid = [], 0
        for name, (desc, members) in groups.items():
            if rank not in members:
                continue
            dropped = rng.randint(0, 2)  # oldest entries evicted by the ring buffer
            for seq, (op, ins, outs) in enumerate(calls[name], start=1):
                if seq <= dropped and seq < len(calls[name]):
                    continue
                e = entry(rid, seq, op, lib=lib, pg=(name, desc), t_ns=T0 + seq * 10**6 + rng.randint(0, 1000))
                e.update(input_sizes=ins, output_sizes=outs, output_dtypes=["Float"] * len(outs))
                entries.append(e)
                rid += 1
        if world > 1 and rng.random() < 0.3:
            entries.append(entry(rid, 0, "send 0->1" if rank == 0 else "recv 1<-0", lib=lib, is_p2p=True, p2p_seq=1))
        if entries or rng.random() < 0.5:
            name = rng.choice((f"nccl_trace_rank_{rank}", f"rank_{rank}.pkl", f"node{rank % 2}/rank{rank}.pickle"))
            write(folder / name.rpartition("/")[0] if "/" in name else folder, name.rpartition("/")[2],
                  dump(entries, groups))


@pytest.mark.parametrize("seed", range(max(100, ROUNDS)))
def test_random_healthy_dump_sets_say_no_hang(tmp_path, seed):
    rng = random.Random(40_000 + seed)
    _healthy_case(rng, tmp_path)
    s = analyze_folder(tmp_path)
    assert s.verdict is Verdict.NO_HANG, (s.headline, [f.message for f in s.findings])
    assert s.culprit_ranks == () and s.unreadable == ()


GARBAGE = (None, "x", -1, 2**70, [], {}, [[None]], 1.5, True)
FIELDS = ("collective_seq_id", "p2p_seq_id", "process_group", "profiling_name", "input_sizes", "output_sizes",
          "input_dtypes", "state", "time_created_ns", "frames", "is_p2p", "retired", "record_id")


@pytest.mark.parametrize("seed", range(ROUNDS))
def test_corrupted_fields_give_an_unreadable_rank_or_an_analysis_never_an_error(tmp_path, seed):
    rng = random.Random(10_000 + seed)
    _case(rng, tmp_path)
    files = sorted(tmp_path.iterdir())
    if not files:
        return
    import pickle

    victim = rng.choice(files)
    data = pickle.loads(victim.read_bytes())  # the test's own data: trusted
    if data["entries"]:
        for _ in range(rng.randint(1, 3)):
            rng.choice(data["entries"])[rng.choice(FIELDS)] = rng.choice(GARBAGE)
    elif rng.random() < 0.5:
        data["pg_config"] = rng.choice(GARBAGE)
    victim.write_bytes(pickle.dumps(data))
    s = analyze_folder(tmp_path)
    assert isinstance(s.verdict, Verdict)
    assert render_text(s) and render_json(s)
    _culprits_are_members(s)


@pytest.mark.parametrize("seed", range(FEWER_ROUNDS))
def test_our_layout_with_odd_context_stacks_and_collection_files_is_analyzed(tmp_path, seed):
    import json

    rng = random.Random(20_000 + seed)
    raw = tmp_path / "raw"
    _case(rng, raw)
    if not raw.exists():
        return
    folder = tmp_path / "stall-001"
    folder.mkdir()
    for f in sorted(raw.iterdir()):
        rank = int(f.name.rsplit("_", 1)[1])
        (folder / f"rank_{rank:05d}.nccl.fr.pkl").write_bytes(f.read_bytes())
        ctx = {"rank": rank, "world_size": rng.choice((rank + 1, 0, None, "3", -2, 10**9)),
               "host": rng.choice(("h0", None, 7, "")), "pg_config": rng.choice(({}, None, [], {"0": {"ranks": "x"}})),
               "phase": rng.choice(("train_step", None, 3)), "step": rng.choice((1, None, "2", True))}
        text = json.dumps(ctx) if rng.random() < 0.8 else rng.choice(("{", "[]", "null", ""))
        (folder / f"rank_{rank:05d}.context.json").write_text(text)
        (folder / f"rank_{rank:05d}.stacks.txt").write_text(rng.choice((
            "", "garbage", '--- thread \'MainThread\' (id 1) ---\n  File "x.py", line 3, in f\n')))
    collection = rng.choice(({"gone_ranks": [0, "1", None, -1], "silent_ranks": {"1": {"pid": 5, "state": "T"}, "x": 3}},
                             {"gone_ranks": "all", "silent_ranks": []}, None, "[", {"silent_ranks": {"2": None}}))
    (folder / "collection.json").write_text(collection if isinstance(collection, str) else json.dumps(collection))
    s = analyze_folder(folder)
    assert isinstance(s.verdict, Verdict)
    assert render_text(s) and render_json(s) and render_html(s)
    # every trace is intact: odd side files may add context, never change what the traces say
    traces_only = analyze_folder(raw)
    assert (s.verdict, s.culprit_ranks) == (traces_only.verdict, traces_only.culprit_ranks)
    _culprits_are_members(s)


@pytest.mark.parametrize("seed", range(FEWER_ROUNDS))
def test_random_dump_sets_written_as_json_are_read_like_pickles(tmp_path, seed):
    import json
    import pickle

    rng = random.Random(30_000 + seed)
    _case(rng, tmp_path / "p")
    if not (tmp_path / "p").exists():
        return
    (tmp_path / "j").mkdir()
    for f in sorted((tmp_path / "p").iterdir()):
        data = pickle.loads(f.read_bytes())  # the test's own data: trusted
        for e in data["entries"]:
            e.pop("frames", None)  # JSON dumps never carry frames
            for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                e[k] = e.get(k) or 0
        (tmp_path / "j" / f.name).write_text(json.dumps(data))
    from_pickle, from_json = analyze_folder(tmp_path / "p"), analyze_folder(tmp_path / "j")
    assert from_json.verdict == from_pickle.verdict
    assert from_json.culprit_ranks == from_pickle.culprit_ranks
    assert from_json.collective_seq_id == from_pickle.collective_seq_id
