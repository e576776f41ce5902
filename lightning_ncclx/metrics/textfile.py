"""A host's ranks in one node_exporter textfile. Each rank writes its snapshot as
``.<name>.ranks/rank_<R>.json`` next to the file (hidden, not ``.prom``: node_exporter ignores
it), then renders every fresh part into the ``.prom`` file: both writes are atomic (tmp + rename),
so node_exporter never reads half a file, and whichever rank writes last has every rank's
latest part in it."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.files import atomic_write_bytes, atomic_write_text
from lightning_ncclx.metrics.families import SnapshotCollector

log = logging.getLogger(__name__)

MAX_PARTS = 4096
MAX_PART_BYTES = 256 * 1024
STALE_INTERVALS = 12
"""A part not rewritten for this many intervals (its rank has exited) is left out of the file."""


def parts_folder(textfile: Path) -> Path:
    return textfile.parent / f".{textfile.name}.ranks"


def read_parts(folder: Path, stale_after_seconds: float, now: float | None = None) -> list[dict[str, Any]]:
    """Every part written within ``stale_after_seconds``, by rank; a part that is not one is skipped."""
    now = time.time() if now is None else now
    snaps: dict[int, dict[str, Any]] = {}
    try:
        paths = sorted(folder.glob("rank_*.json"))[:MAX_PARTS]
    except OSError:
        return []
    for path in paths:
        try:
            stat = path.stat()
            if stat.st_size > MAX_PART_BYTES or now - stat.st_mtime > stale_after_seconds:
                continue
            snap = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(snap, dict) and isinstance(snap.get("rank"), int):
            snaps[snap["rank"]] = snap
    return [snaps[r] for r in sorted(snaps)]


def render(snaps: list[dict[str, Any]]) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snaps))
    return generate_latest(registry)


class TextfileWriter:
    """Writes this rank's part and the merged file every ``interval`` seconds, on a daemon thread."""

    def __init__(self, textfile: Path, interval: float, read: Callable[[], list[dict[str, Any]]], rank: int) -> None:
        self.textfile = Path(textfile)
        self.interval = interval
        self.read = read
        self.rank = rank
        self._stop = threading.Event()
        self._failures_logged = False
        self._thread = threading.Thread(target=self._run, name=f"ncclx-metrics-rank{rank}", daemon=True)

    def start(self) -> None:
        self.write()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def write(self) -> None:
        try:
            folder = parts_folder(self.textfile)
            folder.mkdir(parents=True, exist_ok=True)
            for snap in self.read():
                atomic_write_text(folder / f"rank_{snap['rank']}.json", json.dumps(snap))
            snaps = read_parts(folder, STALE_INTERVALS * self.interval)
            atomic_write_bytes(self.textfile, render(snaps))
        except Exception:  # noqa: BLE001 - metrics never stop training; said once, not every interval
            if not self._failures_logged:
                self._failures_logged = True
                log.warning("[rank %d] writing the metrics textfile %s failed (said once)", self.rank,
                            self.textfile, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self.write()  # the last state: watchdog_up 0
