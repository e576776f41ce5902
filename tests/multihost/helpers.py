"""Small readers shared by the multi-host tests."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Sequence

from support import contexts  # noqa: F401 - shared with the other multi-process tests

JOB = Path(__file__).parent / "jobs" / "multihost_job.py"
STALL_EXIT_CODE = 75


def event_folders(dump_root: Path) -> list[Path]:
    if not dump_root.exists():
        return []
    return sorted(p for p in dump_root.iterdir()
                  if p.is_dir() and p.name.startswith(("stall-", "exception-", "ondemand-")))


def wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float, grace: float = 45.0) -> list[int | None]:
    """Exit codes, None for a process still running when the caller should give up: at
    ``timeout``, or ``grace`` seconds after the first process ended (in a healthy stall run every
    rank ends within seconds of the others; a rank that died early, e.g. at import, leaves the
    rest blocked until the rendezvous timeout). The caller kills what is left."""
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        codes = [proc.poll() for proc in procs]
        if None not in codes:
            return codes  # type: ignore[return-value]
        if any(code is not None for code in codes):
            deadline = min(deadline, time.monotonic() + grace)
            grace = float("inf")  # set the deadline once
        time.sleep(0.2)
    return [proc.poll() for proc in procs]


def read_logs(paths: Sequence[Path], tail: int = 5000) -> str:
    parts = []
    for path in paths:
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        parts.append(f"===== {path} =====\n{text[-tail:]}")
    return "\n".join(parts)
