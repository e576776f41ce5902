"""Two Trainers in one script under Lightning's ``ddp`` (popen) launcher, 2 real gloo ranks: each
Trainer has one run id and folder shared by its ranks, and the environment ends as it began."""

from __future__ import annotations

import json
from pathlib import Path

from support import PYTHON, run_job

JOB = Path(__file__).parent / "jobs" / "two_trainers_job.py"
# Lightning's own launcher leaves these in the launching process (its tests allow them too).
LIGHTNINGS_OWN = {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS",
                  "OMP_NUM_THREADS"}


def test_two_trainers_in_one_script_get_two_runs_and_leave_the_environment_as_it_was(tmp_path: Path) -> None:
    out, root = tmp_path / "out", tmp_path / "root"
    out.mkdir()
    result = run_job([PYTHON, str(JOB), "--out", str(out), "--root", str(root), "--devices", "2"], cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.tail()
    ranks = [json.loads((out / f"rank_{r}.json").read_text()) for r in range(2)]
    first = {r["trainers"][0]["run_id"] for r in ranks}
    second = {r["trainers"][1]["run_id"] for r in ranks}
    assert len(first) == len(second) == 1, f"ranks disagree: {first} {second}"
    assert first != second
    assert len({r["trainers"][0]["dump_dir"] for r in ranks} | {r["trainers"][1]["dump_dir"] for r in ranks}) == 2
    for seen in ranks:
        before, after = seen["before"], seen["after"]
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert changed <= LIGHTNINGS_OWN, f"rank {seen['trainers'][0]['rank']} kept {changed - LIGHTNINGS_OWN}"
    assert not (root / "ncclx_dumps").exists(), sorted(str(p) for p in root.rglob("*"))
