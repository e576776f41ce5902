"""``backend/torch_api.py`` on the installed torch: a real 1-rank gloo job with a subgroup, its
real flight recorder and its real store; the NCCL version's formats."""

from __future__ import annotations

import json
import pickle
import re
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lightning_ncclx.backend import torch_api
from support import one_rank_gloo


def test_before_init_process_group_there_is_no_group_and_no_store() -> None:
    assert not dist.is_initialized()
    assert torch_api.default_group() is None
    assert torch_api.member_groups() == [] and torch_api.group_members() == []
    with pytest.raises(ValueError, match="has not been initialized"):
        torch_api.default_store()


def test_member_groups_start_with_the_world_group(tmp_path: Path) -> None:
    with one_rank_gloo(tmp_path / "store", sub_desc="my_sub") as sub:
        groups = torch_api.member_groups()
        assert groups[0] is torch_api.default_group() is dist.group.WORLD
        assert groups[1:] == [sub]


def test_group_members_name_each_group_with_its_description_and_ranks(tmp_path: Path) -> None:
    with one_rank_gloo(tmp_path / "store", sub_desc="my_sub"):
        members = {g.desc: g for g in torch_api.group_members()}
        assert set(members) == {"default_pg", "my_sub"}
        assert members["default_pg"].ranks == (0,) and members["my_sub"].ranks == (0,)
        assert members["default_pg"].name != members["my_sub"].name


def test_group_backends_name_the_implementation_that_serves_each_device(tmp_path: Path) -> None:
    with one_rank_gloo(tmp_path / "store") as sub:
        served = {device.type: type(backend).__name__ for device, backend in torch_api.group_backends(sub)}
        assert served["cpu"] == "ProcessGroupGloo"


def test_a_group_timeout_is_set_and_read_back(tmp_path: Path) -> None:
    with one_rank_gloo(tmp_path / "store") as sub:
        torch_api.set_group_timeout(timedelta(seconds=42), sub)
        seconds = {torch_api.backend_timeout_seconds(backend) for _, backend in torch_api.group_backends(sub)}
        assert seconds == {42.0}


def test_a_backend_without_options_has_no_timeout() -> None:
    assert torch_api.backend_timeout_seconds(object()) is None


def test_the_default_store_is_the_jobs_store(tmp_path: Path) -> None:
    with one_rank_gloo(tmp_path / "store"):
        store = torch_api.default_store()
        store.set("torch_api_probe", b"1")
        assert store.get("torch_api_probe") == b"1"


def _gloo_all_reduces() -> int:
    entries = pickle.loads(torch_api.dump_fr_trace(True, False, False, "gloo")).get("entries", [])
    return sum(e["profiling_name"] == "gloo:all_reduce" for e in entries)


def test_the_gloo_recorder_dumps_as_pickle_and_as_json(tmp_path: Path) -> None:
    before = _gloo_all_reduces()  # the recorder lives as long as the process
    with one_rank_gloo(tmp_path / "store", calls_in_sub=3):
        assert _gloo_all_reduces() == min(before + 4, 2000)
        as_json = json.loads(torch_api.dump_fr_trace_json(False, True, "gloo"))
        assert "pg_status" in as_json and "entries" not in as_json


def test_each_backend_has_a_recorder_of_its_own_from_2_15(tmp_path: Path) -> None:
    with one_rank_gloo(tmp_path / "store"):
        nccl2 = pickle.loads(torch_api.dump_fr_trace(True, False, False, "nccl2")).get("entries", [])
        if torch_api.has_nccl2():  # 2.15: the hook's recorder for nccl2 holds none of gloo's entries
            assert nccl2 == []
        else:  # 2.13: one recorder for all, whatever the name
            assert len(nccl2) == len(pickle.loads(torch_api.dump_fr_trace(True, False, False, "gloo"))["entries"]) > 0


def test_this_torch_has_nccl2_exactly_when_it_is_2_15_or_newer() -> None:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    assert torch_api.has_nccl2() == ((major, minor) >= (2, 15))


def test_nccl_version_is_dotted_when_torch_has_nccl() -> None:
    version = torch_api.nccl_version()
    if not dist.is_nccl_available():
        assert version is None
    else:
        assert version is not None and re.fullmatch(r"\d+\.\d+\.\d+(\.\w+)?", version), version


@pytest.mark.parametrize(("reported", "expected"), [((2, 21, 5), "2.21.5"), (21805, "21805")])
def test_nccl_version_formats_a_tuple_or_an_old_integer(monkeypatch: pytest.MonkeyPatch, reported, expected) -> None:
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: reported)
    assert torch_api.nccl_version() == expected


def test_a_libnccl_that_fails_to_load_is_no_version_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> tuple[int, ...]:
        raise OSError("libnccl.so.2: cannot open shared object file")

    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", broken)
    assert torch_api.nccl_version() is None
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (9, 9, 9))
    assert torch_api.nccl_version() is None  # no NCCL in this torch: its version is not asked
