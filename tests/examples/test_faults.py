"""Each fault preset ends by itself in a stall summary naming the faulty rank, and command-line
overrides reach every rank (each rank's dump context records what it ran with)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import PYTHON, REPO_ROOT, run_job

EXAMPLES = REPO_ROOT / "examples"
STALL_EXIT_CODE = 75
PROGRAM_ERROR_EXIT_CODE = 76
pytestmark = pytest.mark.timeout(240)


def contexts(folder: Path) -> dict[int, dict]:
    found = {}
    for path in sorted(folder.rglob("rank_*.context.json")):
        data = json.loads(path.read_text())
        found.setdefault(int(data["rank"]), data)
    return found


def summary_of(out: Path, log: str) -> tuple[Path, dict]:
    stall = out / "ncclx_dumps" / "stall-001"
    assert (stall / "summary.json").is_file(), f"no summary in {stall}\n{log[-4000:]}"
    for name in ("summary.txt", "summary.html"):
        assert (stall / name).is_file()
    return stall, json.loads((stall / "summary.json").read_text())


@pytest.mark.parametrize(
    ("app", "strategy", "fault", "extra", "culprit", "exit_code"),
    [
        ("train_ddp", "ddp_ncclx", "wrong_op", [], 1, PROGRAM_ERROR_EXIT_CODE),  # argument_mismatch
        ("train_fsdp", "fsdp2_ncclx", "stuck", [], 0, STALL_EXIT_CODE),
        ("train_ddp", "ddp_ncclx", "stuck", ["fault.where=loader"], 1, STALL_EXIT_CODE),
    ],
    ids=["ddp-wrong_op", "fsdp2-stuck_in_step", "ddp-stuck_in_loader"],
)
def test_fault_preset_ends_in_a_summary_naming_the_culprit(tmp_path: Path, app, strategy, fault, extra, culprit,
                                                           exit_code) -> None:
    out = tmp_path / "run"
    result = run_job(
        [PYTHON, str(EXAMPLES / f"{app}.py"), f"hydra.run.dir={out}", f"strategy={strategy}", "trainer=ddp_sim",
         "trainer.devices=2", "model=gpt_tiny", f"+fault={fault}", f"fault.rank={culprit}", "fault.step=3", *extra,
         "ncclx.flight_recorder.buffer_size=3000", "ncclx.watchdog.train_step_seconds=8"],
        cwd=tmp_path, timeout=200,
    )
    assert result.returncode == exit_code, result.tail()
    stall, summary = summary_of(out, result.output)
    assert culprit in summary["culprit_ranks"], (summary.get("verdict"), summary["culprit_ranks"])
    assert summary["verdict"]
    ranks = contexts(stall)
    assert sorted(ranks) == [0, 1]
    for rank, ctx in ranks.items():  # the overrides reached every rank
        assert ctx["flight_recorder"]["TORCH_FR_BUFFER_SIZE"] == "3000", rank
        assert ctx["flight_recorder"]["TORCH_FR_DUMP_TEMP_FILE"].startswith(str(out / "ncclx_dumps"))
        if ctx["phase"] == "train_step":
            assert ctx["stall_threshold_seconds"] == 8.0, ctx


def test_demo_prints_the_summary_of_a_three_rank_fsdp_hang(tmp_path: Path) -> None:
    result = run_job([PYTHON, str(EXAMPLES / "demo.py"), "--out", str(tmp_path / "demo")], cwd=tmp_path, timeout=230)
    assert result.returncode == 0, result.tail()
    assert "HANG:" in result.output and "culprit rank(s) 2" in result.output
    assert "demo: OK - the summary names rank 2" in result.output
    assert str(tmp_path / "demo" / "ncclx_dumps" / "stall-001" / "summary.html") in result.output
    _, summary = summary_of(tmp_path / "demo", result.output)
    assert summary["culprit_ranks"] == [2]
    assert len(contexts(tmp_path / "demo" / "ncclx_dumps" / "stall-001")) == 3
