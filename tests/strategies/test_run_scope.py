"""RunScope: what a run sets is taken back; run ids: one per Trainer, the same on every rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_ncclx.layout import RUN_ID_VARIABLE
from lightning_ncclx.errors import ConfigError
from lightning_ncclx.strategies import run_scope
from lightning_ncclx.strategies.run_scope import RunScope, exported, next_run_id


def test_close_restores_changed_and_removes_added_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "123")
    monkeypatch.delenv("TORCH_FR_DUMP_ON_TIMEOUT", raising=False)
    scope = RunScope()
    scope.export({"TORCH_FR_BUFFER_SIZE": "20000", "TORCH_FR_DUMP_ON_TIMEOUT": "1"})
    scope.export({"TORCH_FR_BUFFER_SIZE": "30000"})  # a second set-up (fit, then test) keeps the first saved value
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "30000"
    scope.close()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "123"
    assert "TORCH_FR_DUMP_ON_TIMEOUT" not in os.environ


def test_exported_sets_variables_only_inside_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_ID_VARIABLE, raising=False)
    with exported({RUN_ID_VARIABLE: "run-x"}):
        assert os.environ[RUN_ID_VARIABLE] == "run-x"
    assert RUN_ID_VARIABLE not in os.environ


def test_close_removes_only_the_new_folders_that_stayed_empty(tmp_path: Path) -> None:
    kept = tmp_path / "existing"
    kept.mkdir()
    scope = RunScope()
    scope.make_writable_folder(kept / "ncclx_dumps" / "run-1" / "torch", "key")
    scope.make_writable_folder(tmp_path / "ncclx_dumps" / "run-2" / "torch", "key")
    (tmp_path / "ncclx_dumps" / "run-2" / "stall-001").mkdir()  # something was dumped in run-2
    scope.close()
    assert kept.is_dir() and not (kept / "ncclx_dumps").exists()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "existing", "ncclx_dumps", "ncclx_dumps/run-2", "ncclx_dumps/run-2/stall-001",
    ]


def test_unwritable_folder_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"ncclx.flight_recorder.dump_dir: the dump folder '/proc/x' is not writable"):
        RunScope().make_writable_folder(Path("/proc/x"), "ncclx.flight_recorder.dump_dir")


def test_each_trainer_gets_its_own_run_id_the_same_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (RUN_ID_VARIABLE, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(run_scope, "_base_run_id", None)
    monkeypatch.setattr(run_scope, "_trainers_in_process", 0)
    launching = [next_run_id(), next_run_id(), next_run_id()]
    assert launching[1:] == [f"{launching[0]}-2", f"{launching[0]}-3"]
    # A child rank of the first Trainer was started with the launching process's first id.
    monkeypatch.setattr(run_scope, "_base_run_id", None)
    monkeypatch.setattr(run_scope, "_trainers_in_process", 0)
    monkeypatch.setenv(RUN_ID_VARIABLE, launching[0])
    assert [next_run_id(), next_run_id(), next_run_id()] == launching


def test_a_launchers_id_is_the_base_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_ID_VARIABLE, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setattr(run_scope, "_base_run_id", None)
    monkeypatch.setattr(run_scope, "_trainers_in_process", 0)
    assert [next_run_id(), next_run_id()] == ["torchrun-abc", "torchrun-abc-2"]


def test_folders_another_rank_made_are_removed_by_whichever_rank_closes_last(tmp_path: Path) -> None:
    from lightning_ncclx.dump.location import plugin_named_folders

    dump_dir = tmp_path / "ncclx_dumps" / "run-1"
    first, second = RunScope(), RunScope()
    first.make_writable_folder(dump_dir / "torch", "key")   # rank 0 makes them
    second.make_writable_folder(dump_dir / "torch", "key")  # rank 1 finds them there
    for scope in (first, second):
        scope.remove_when_empty(plugin_named_folders(dump_dir, configured=False))
    busy = dump_dir / ".rank_00001.native-stacks.txt"
    busy.write_text("")  # rank 1's watchdog still runs when rank 0 closes
    first.close()
    assert dump_dir.is_dir()
    busy.unlink()
    second.close()
    assert list(tmp_path.iterdir()) == []


def test_a_configured_dump_folder_is_never_removed(tmp_path: Path) -> None:
    from lightning_ncclx.dump.location import plugin_named_folders

    assert plugin_named_folders(tmp_path / "mine", configured=True) == [tmp_path / "mine" / "torch"]
