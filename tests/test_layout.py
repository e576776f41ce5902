"""The dump folder's naming contract (``layout.py``): per-rank file names, where native and
teardown stacks go, which files are the plugin's own side files (never dumps), and the run id's
precedence (explicit > torchrun > SLURM, with torchrun's ``none`` placeholder skipped).

The basic run-id cases are in ``tests/dump/test_location.py``; here the remaining rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_ncclx import layout
from lightning_ncclx.layout import (
    RUN_ID_VARIABLE,
    is_plugin_side_file,
    native_stacks_path,
    rank_file,
    rank_prefix,
    run_id_from_environment,
    teardown_stacks_path,
    trace_file,
)


@pytest.mark.parametrize(("rank", "expected"), [(0, "rank_00000"), (3, "rank_00003"), (12345, "rank_12345"),
                                                 (123456, "rank_123456")])
def test_rank_prefix_pads_to_five_digits_and_never_truncates(rank: int, expected: str) -> None:
    assert rank_prefix(rank) == expected


def test_per_rank_file_names() -> None:
    assert rank_file(3, "context.json") == "rank_00003.context.json"
    assert trace_file(3, "gloo") == "rank_00003.gloo.fr.pkl"
    assert trace_file(70, "nccl2") == "rank_00070.nccl2.fr.pkl"


def test_native_stacks_are_hidden_in_the_dump_folder_and_teardown_stacks_are_not(tmp_path: Path) -> None:
    assert native_stacks_path(tmp_path, 7) == tmp_path / ".rank_00007.native-stacks.txt"
    assert teardown_stacks_path(tmp_path, 7) == tmp_path / "teardown-rank7.stacks.txt"
    assert native_stacks_path(str(tmp_path), 0).parent == tmp_path  # a str folder is accepted


@pytest.mark.parametrize(
    "name",
    ["summary.json", "summary.txt", "summary.html", "summary.md", "collection.json", "stragglers.json",
     "rank_00003.native-stacks.txt", ".rank_00003.native-stacks.txt", "teardown-rank3.stacks.txt",
     "rank_00001.gloo.fr.pkl.tmp", "rank_00001.gloo.fr.pkl.partial"],
)
def test_reports_collection_stack_and_temporary_files_are_side_files(name: str) -> None:
    assert is_plugin_side_file(name) is True


@pytest.mark.parametrize(
    "name",
    ["rank_00003.gloo.fr.pkl", "rank_00003.context.json", "rank_00003.stacks.txt", "nccl_trace_rank_3",
     "summary.json.bak", "teardown-rank3.txt", "my-teardown-rank3.stacks.txt", "stragglers.json.old"],
)
def test_dumps_and_look_alikes_are_not_side_files(name: str) -> None:
    assert is_plugin_side_file(name) is False


def test_event_prefixes_name_every_event_reason() -> None:
    assert layout.EVENT_PREFIXES == ("stall-", "ondemand-", "exception-")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({RUN_ID_VARIABLE: "", "TORCHELASTIC_RUN_ID": "abc"}, "torchrun-abc"),  # an empty explicit id is no id
        ({"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "12"}, "torchrun-abc"),  # torchrun beats SLURM
        ({"TORCHELASTIC_RUN_ID": "", "SLURM_JOB_ID": "12"}, "slurm-12"),
        ({"SLURM_JOB_ID": "12", "SLURM_STEP_ID": ""}, "slurm-12"),  # no step: no trailing dot
        ({"SLURM_STEP_ID": "3"}, None),  # a step without a job is not an id
        ({"TORCHELASTIC_RUN_ID": "none"}, None),
    ],
)
def test_run_id_precedence_and_empty_values(environ: dict[str, str], expected: str | None) -> None:
    assert run_id_from_environment(environ) == expected


def test_run_id_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (RUN_ID_VARIABLE, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "881")
    monkeypatch.setenv("SLURM_STEP_ID", "2")
    assert run_id_from_environment() == "slurm-881.2"
    assert run_id_from_environment({}) is None  # an explicit mapping replaces the environment
