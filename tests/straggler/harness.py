"""Run ``jobs/straggler_job.py`` as a real 4-rank Lightning fit (gloo on CPU) and read what it left.

Each job runs in its own session and the whole session is killed in a ``finally``: no rank
outlives its test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOB = Path(__file__).parent / "jobs" / "straggler_job.py"
REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_SECONDS = 240.0


def free_port() -> int:
    """See :func:`support.free_port`."""
    from support import free_port as below_the_ephemeral_range

    return below_the_ephemeral_range()


@dataclass
class JobResult:
    returncode: int | None
    log: str
    root: Path

    def stragglers(self) -> dict[str, Any]:
        found = sorted(self.root.rglob("stragglers.json"))
        assert len(found) == 1, f"stragglers.json files: {found}\n{self.log[-4000:]}"
        return json.loads(found[0].read_text())

    def warnings(self) -> list[str]:
        return [line for line in self.log.splitlines() if "straggler: rank" in line]

    def metrics_rows(self) -> list[dict[str, str]]:
        import csv

        rows: list[dict[str, str]] = []
        for path in self.root.rglob("metrics.csv"):
            with open(path, newline="") as handle:
                rows += [r for r in csv.DictReader(handle) if r.get("ncclx/straggler/score_max")]
        return rows


def run_job(tmp_path: Path, *args: str, extra_env: dict[str, str] | None = None,
            pythonpath: list[Path] | None = None, timeout: float = JOB_TIMEOUT_SECONDS) -> JobResult:
    root = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "LIGHTNING_NCCLX"))}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK"):
        env.pop(key, None)
    paths = [str(p) for p in (pythonpath or [])] + [str(REPO), env.get("PYTHONPATH", "")]
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in paths if p), **(extra_env or {}))
    log_path = tmp_path / "job.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(JOB), "--root-dir", str(root), *args], cwd=tmp_path, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return JobResult(code, log_path.read_text(errors="replace"), root)
