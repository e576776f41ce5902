"""Start :mod:`alert_server` in its own process session and read what it received."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from contextlib import contextmanager

from support import clean_env, free_port, kill_session
from watchdog.harness import wait_for

SERVER = Path(__file__).parent / "alert_server.py"


@dataclass
class AlertServer:
    port: int
    record: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def posts(self, path_prefix: str = "") -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        rows = [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]
        return [row for row in rows if row["path"].startswith(path_prefix)]


@contextmanager
def alert_server(folder: Path, mode: str = "ok") -> Iterator[AlertServer]:
    folder.mkdir(parents=True, exist_ok=True)
    port_file, record = folder / f"port-{mode}", folder / f"posts-{mode}.jsonl"
    proc = subprocess.Popen([sys.executable, str(SERVER), "--mode", mode, "--record", str(record),
                             "--port-file", str(port_file)], env=clean_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(port_file.exists, 30.0), "the alert server did not start"
        yield AlertServer(int(port_file.read_text()), record)
    finally:
        kill_session(proc)
        proc.wait()


def refused_url(path: str = "/") -> str:
    """A URL on a port nothing listens on (connection refused)."""
    return f"http://127.0.0.1:{free_port()}{path}"
