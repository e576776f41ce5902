"""The example recipes as users run them: real Lightning, real gloo, 2-3 CPU processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import PYTHON, REPO_ROOT, run_job

EXAMPLES = REPO_ROOT / "examples"
STALL_EXIT_CODE = 75
pytestmark = pytest.mark.timeout(240)


def recipe(app: str, out: Path, *overrides: str, timeout: float = 180.0):
    return run_job([PYTHON, str(EXAMPLES / f"{app}.py"), f"hydra.run.dir={out}", *overrides], cwd=out.parent,
                   timeout=timeout)


def test_fsdp_recipe_trains_and_saves_a_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = recipe("train_fsdp", out, "experiment=fsdp_cpu_smoke")
    assert result.returncode == 0, result.tail()
    assert "done: 6 steps with FSDPNcclxStrategy" in result.output
    assert "fsdp_ncclx: backend asked=auto -> gloo" in result.output
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert (out / "checkpoints" / "step000006.ckpt").is_file()


def test_fsdp2_recipe_trains_and_saves_a_sharded_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = recipe("train_fsdp", out, "experiment=fsdp2_cpu_smoke", "model.activation_checkpointing=true")
    assert result.returncode == 0, result.tail()
    assert "done: 6 steps with FSDP2NcclxStrategy" in result.output
    shards = {p.name for p in (out / "checkpoints" / "last.ckpt").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp"} <= shards, shards


def test_bad_ncclx_value_ends_with_one_line_and_exit_code_2(tmp_path: Path) -> None:
    result = recipe("train_ddp", tmp_path / "run", "trainer=cpu", "ncclx.watchdog.exit_code=0", timeout=60)
    assert result.returncode == 2, result.tail()
    assert "error: ncclx.watchdog.exit_code=0 is not valid: expected an exit code from 1 to 255" in result.output
    assert "Traceback" not in result.output


def test_a_buffer_size_past_torchs_limit_ends_with_one_line_not_a_hang(tmp_path: Path) -> None:
    """torch reads the size as a C int: 2**31 would hang group creation without a word."""
    result = recipe("train_fsdp", tmp_path / "run", "trainer=cpu", "ncclx.flight_recorder.buffer_size=2147483648",
                    timeout=60)
    assert result.returncode == 2, result.tail()
    assert ("error: ncclx.flight_recorder.buffer_size=2147483648 is not valid: expected an integer from 0 to "
            "2147483647") in result.output
    assert "Traceback" not in result.output


def test_wrong_type_fails_at_compose_time_with_hydras_message(tmp_path: Path) -> None:
    result = recipe("train_fsdp", tmp_path / "run", "ncclx.flight_recorder.buffer_size=abc", timeout=60)
    assert result.returncode == 1
    assert "Value 'abc' of type 'str' could not be converted to Integer" in result.output
    assert "full_key: ncclx.flight_recorder.buffer_size" in result.output
