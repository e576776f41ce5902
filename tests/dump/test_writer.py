"""What one rank writes, checked in a real single-rank gloo process group."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from support import one_rank_gloo
from lightning_ncclx.dump.traces import backends_in_use, fix_pg_config
from lightning_ncclx.dump.writer import format_stacks, write_rank_dump
from lightning_ncclx.files import atomic_write_text


@pytest.fixture
def gloo_world(tmp_path: Path):
    with one_rank_gloo(tmp_path / "store"):
        yield


def test_rank_dump_has_trace_stacks_and_context(tmp_path: Path, gloo_world) -> None:
    folder = tmp_path / "stall-001"
    progress = {"phase": "train_step", "step": 7, "global_step": 3, "seconds_since_heartbeat": 4.2,
                "stall_threshold_seconds": 3.0}
    files = write_rank_dump(folder, event="stall-001", reason="stall", initiator_rank=0, progress=progress)
    names = sorted(p.name for p in files)
    assert names == ["rank_00000.context.json", "rank_00000.gloo.fr.pkl", "rank_00000.stacks.txt"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], "temporary files left behind"
    ctx = json.loads((folder / "rank_00000.context.json").read_text())
    assert ctx["schema"] == "lightning-ncclx/context/1"
    assert (ctx["rank"], ctx["world_size"], ctx["phase"], ctx["step"]) == (0, 1, "train_step", 7)
    assert ctx["backends"] == {"cpu": "gloo"} and ctx["trace_files"] == ["rank_00000.gloo.fr.pkl"]
    assert {v["desc"] for v in ctx["pg_config"].values()} == {"default_pg", "my_sub"}
    trace = pickle.loads((folder / "rank_00000.gloo.fr.pkl").read_bytes())
    assert {v["desc"] for v in trace["pg_config"].values()} == {"default_pg", "my_sub"}
    assert all(isinstance(v["ranks"], str) for v in trace["pg_config"].values())
    assert "pg_config_raw" in trace
    assert {e["profiling_name"] for e in trace["entries"]} >= {"gloo:all_reduce"}


def test_backends_in_use_reports_gloo_once(gloo_world) -> None:
    assert [b.file_tag for b in backends_in_use()] == ["gloo"]


def test_no_process_group_still_writes_stacks_and_context(tmp_path: Path) -> None:
    files = write_rank_dump(tmp_path, event="ondemand-001", reason="on_demand", initiator_rank=0, progress={})
    assert sorted(p.name for p in files) == ["rank_00000.context.json", "rank_00000.stacks.txt"]


def test_fix_pg_config_keeps_the_raw_one() -> None:
    fixed = fix_pg_config({"pg_config": {"": {"name": "", "desc": "", "ranks": "[0]"}}, "entries": []},
                          {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]}})
    assert fixed["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    assert fixed["pg_config_raw"] == {"": {"name": "", "desc": "", "ranks": "[0]"}}


def test_stacks_name_every_thread() -> None:
    import threading

    release = threading.Event()
    helper = threading.Thread(target=release.wait, name="ncclx-test-helper", daemon=True)
    helper.start()
    try:
        text = format_stacks()
    finally:
        release.set()
        helper.join()
    assert "MainThread" in text and "ncclx-test-helper" in text
    helper_part = text[text.index("ncclx-test-helper"):]
    assert "in wait" in helper_part  # the helper's own stack, not only its name


def test_atomic_write_replaces(tmp_path: Path) -> None:
    path = atomic_write_text(tmp_path / "a" / "f.txt", "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two" and [p.name for p in path.parent.iterdir()] == ["f.txt"]


def test_a_torch_without_the_backend_argument_still_gets_its_gloo_trace(gloo_world, monkeypatch) -> None:
    """torch 2.13's (and 2.11's) ``_dump_fr_trace`` takes no ``backend``: pybind raises
    TypeError ("incompatible function arguments"); the one shared recorder is then dumped."""
    from torch._C import _distributed_c10d as c

    real = c._dump_fr_trace

    def old_signature(include_collectives, include_stacks, only_active, **kwargs):
        if kwargs:
            raise TypeError("_dump_fr_trace(): incompatible function arguments")
        return real(include_collectives, include_stacks, only_active)

    monkeypatch.setattr(c, "_dump_fr_trace", old_signature)
    from lightning_ncclx.dump.traces import dump_traces

    trace = pickle.loads(dump_traces(stack_traces=False)["gloo"])
    assert "gloo:all_reduce" in {e["profiling_name"] for e in trace["entries"]}
