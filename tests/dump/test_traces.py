"""``dump/traces.py``: which recorder a backend's dump lives in (its file tag), the backends and
groups read from a real 1-rank gloo world, the repaired ``pg_config`` of gloo's dump, and a
failing backend skipped rather than failing the dump.

The basics (gloo reported once, the raw ``pg_config`` kept, torch without the ``backend``
argument) are in ``tests/dump/test_writer.py``."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from support import one_rank_gloo
from lightning_ncclx.dump import traces
from lightning_ncclx.dump.traces import BackendInUse, backends_in_use, device_backends, dump_traces, fix_pg_config, real_pg_config


@pytest.fixture
def gloo_world(tmp_path: Path):
    with one_rank_gloo(tmp_path / "store"):
        yield


@pytest.mark.parametrize(("name", "tag"), [("NCCL", "nccl"), ("nccl", "nccl"), ("nccl-legacy", "nccl"),
                                           ("nccl2", "nccl2"), ("nccl-lazy", "nccl-lazy"), ("gloo", "gloo"),
                                           ("XCCL", "xccl")])
def test_the_file_tag_folds_legacy_nccl_names_and_lowercases_the_rest(name: str, tag: str) -> None:
    assert BackendInUse(device="cuda", name=name).file_tag == tag


def test_without_a_process_group_nothing_is_in_use_or_dumped() -> None:
    assert not dist.is_initialized()
    assert (backends_in_use(), device_backends(), real_pg_config(), dump_traces()) == ([], {}, {}, {})


def test_gloo_serves_the_cpu_and_cuda_is_skipped_without_a_gpu(gloo_world) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: gloo serves cuda here")
    assert device_backends() == {"cpu": "gloo"}
    assert backends_in_use() == [BackendInUse(device="cpu", name="gloo")]


def test_real_pg_config_lists_every_group_with_sorted_integer_ranks(gloo_world) -> None:
    assert real_pg_config() == {"0": {"name": "0", "desc": "default_pg", "ranks": [0]},
                                "1": {"name": "1", "desc": "my_sub", "ranks": [0]}}


def test_fix_pg_config_writes_ranks_as_torch_does_and_leaves_the_input_alone() -> None:
    original = {"version": "2.10", "entries": [{"record_id": 0}]}
    fixed = fix_pg_config(original, {"3": {"name": "3", "desc": "tp", "ranks": (4, 5)}})
    assert fixed["pg_config"] == {"3": {"name": "3", "desc": "tp", "ranks": "[4, 5]"}}
    assert fixed["pg_config_raw"] is None  # the dump had none
    assert fixed["entries"] == [{"record_id": 0}] and fixed["version"] == "2.10"
    assert original == {"version": "2.10", "entries": [{"record_id": 0}]}


def test_the_gloo_dump_carries_the_real_groups_not_torchs_single_empty_one(gloo_world) -> None:
    trace = pickle.loads(dump_traces(stack_traces=False)["gloo"])
    assert trace["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"},
                                  "1": {"name": "1", "desc": "my_sub", "ranks": "[0]"}}
    assert list(trace["pg_config_raw"]) == [""]
    entries = [e for e in trace["entries"] if e["profiling_name"] == "gloo:all_reduce"]
    assert len(entries) >= 2


def test_a_backend_whose_dump_fails_is_logged_and_left_out(gloo_world, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from torch._C import _distributed_c10d as c

    def failing(*args, **kwargs):
        raise RuntimeError("recorder lock poisoned")

    monkeypatch.setattr(c, "_dump_fr_trace", failing)
    with caplog.at_level(logging.WARNING, logger=traces.__name__):
        assert dump_traces(stack_traces=False) == {}
    assert [r.getMessage() for r in caplog.records] == ["flight-recorder dump of backend gloo failed"]
