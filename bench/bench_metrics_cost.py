"""The cost of ``ncclx.metrics`` on a healthy job: a 1-rank Lightning fit (a tiny model on CPU,
the stall watchdog on) with and without a ``MetricsExporter`` (a port and a textfile written
every 0.5 s, ten times the default rate), rounds alternated, as a ratio of fit times; and the
CPU time one scrape and one textfile write take (``time.thread_time``).

    python bench/bench_metrics_cost.py [--rounds 3] [--steps 400]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fit_seconds(steps: int, folder: Path, metrics: bool) -> float:
    import torch
    from lightning.pytorch import LightningModule, Trainer

    from lightning_ncclx.config import MetricsConfig
    from lightning_ncclx.metrics import MetricsExporter
    from lightning_ncclx.watchdog import StallWatchdog

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 1)

        def training_step(self, batch, batch_idx):  # noqa: ANN001
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks: list = [StallWatchdog(dump_dir=folder / "dumps")]
    if metrics:
        callbacks.append(MetricsExporter(MetricsConfig(port=_free_port(), address="127.0.0.1",
                                                       textfile=str(folder / "ncclx.prom"), interval_seconds=0.5)))
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=folder, callbacks=callbacks)
    data = torch.utils.data.DataLoader(torch.randn(steps, 32), batch_size=1)
    started = time.perf_counter()
    trainer.fit(Tiny(), data)
    return time.perf_counter() - started


def cpu_per_call(folder: Path, calls: int = 200) -> tuple[float, float]:
    from lightning_ncclx.config import MetricsConfig
    from lightning_ncclx.metrics import MetricsExporter
    from lightning_ncclx.metrics.server import MetricsServer
    from lightning_ncclx.metrics.textfile import TextfileWriter

    snap = {"rank": 0, "local_rank": 0, "host": "h", "watchdog_up": 1, "global_step": 5, "step_seconds": 0.1,
            "seconds_since_heartbeat": 0.2, "phase": "train_step", "events": {"stall": 0, "on_demand": 0,
                                                                             "recovered": 0},
            "dumps_written": 0, "hang_kinds": {}, "straggler_scores": {str(r): 1.0 for r in range(8)}}
    writer = TextfileWriter(folder / "cost.prom", 5.0, lambda: [snap], 0)
    started = time.thread_time()
    for _ in range(calls):
        writer.write()
    write_cpu = (time.thread_time() - started) / calls
    port = _free_port()
    server = MetricsServer("127.0.0.1", port, lambda: [snap])
    started = time.process_time()
    for _ in range(calls):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            answer.read()
    scrape_cpu = (time.process_time() - started) / calls  # client and server side, one process
    server.stop()
    del MetricsExporter, MetricsConfig
    return write_cpu, scrape_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    off, on = [], []
    with tempfile.TemporaryDirectory(prefix="ncclx-metrics-cost-") as tmp:
        fit_seconds(20, Path(tmp) / "warm", False)  # imports and first-fit set-up, outside the rounds
        for r in range(args.rounds):
            for metrics in ((False, True) if r % 2 == 0 else (True, False)):
                folder = Path(tmp) / f"r{r}-{metrics}"
                (on if metrics else off).append(fit_seconds(args.steps, folder, metrics))
        write_cpu, scrape_cpu = cpu_per_call(Path(tmp))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {args.rounds} rounds of {args.steps} steps")
    print(f"fit without metrics: median {statistics.median(off):.2f} s ({', '.join(f'{x:.2f}' for x in off)})")
    print(f"fit with metrics:    median {statistics.median(on):.2f} s ({', '.join(f'{x:.2f}' for x in on)})")
    print(f"ratio with/without: {statistics.median(on) / statistics.median(off):.3f}")
    print(f"CPU per textfile write (part + merged file, fsync'd): {write_cpu * 1e3:.2f} ms; "
          f"per scrape (client + server): {scrape_cpu * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
