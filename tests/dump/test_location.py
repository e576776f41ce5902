"""Where a run's dumps go: configured (with per-rank variable expansion), Hydra, run id."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_ncclx.dump.location import resolve_dump_dir, torch_dump_prefix
from lightning_ncclx.layout import RUN_ID_VARIABLE, run_id_from_environment


def test_configured_folder_expands_each_ranks_own_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert resolve_dump_dir("$TMPDIR/ncclx/$SLURM_JOB_ID", "/ignored") == tmp_path / "ncclx" / "77"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({RUN_ID_VARIABLE: "mine", "SLURM_JOB_ID": "1"}, "mine"),
        ({"TORCHELASTIC_RUN_ID": "abc"}, "torchrun-abc"),
        ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0"}, "slurm-12.0"),
        ({}, None),
    ],
)
def test_run_id_comes_from_the_launchers_environment(environ: dict[str, str], expected: str | None) -> None:
    assert run_id_from_environment(environ) == expected


def test_default_folder_is_per_run_under_the_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (RUN_ID_VARIABLE, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    assert resolve_dump_dir(None, tmp_path) == tmp_path / "ncclx_dumps"
    monkeypatch.setenv(RUN_ID_VARIABLE, "run-1")
    folder = resolve_dump_dir(None, tmp_path)
    assert folder == tmp_path / "ncclx_dumps" / "run-1"
    assert torch_dump_prefix(folder, "nccl_trace_rank_") == folder / "torch" / "nccl_trace_rank_"


def test_under_hydra_a_later_trainer_gets_a_folder_of_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from lightning_ncclx.dump import location

    monkeypatch.setattr(location, "hydra_output_dir", lambda: tmp_path)
    assert resolve_dump_dir(None, "/ignored", "run-1") == tmp_path / "ncclx_dumps"
    assert resolve_dump_dir(None, "/ignored", "run-1-2", trainer_number=2) == tmp_path / "ncclx_dumps-2"
