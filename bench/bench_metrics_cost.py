"""The cost of ``ncclx.metrics`` on a healthy job: 1-rank Lightning fits (a tiny model on CPU,
the stall watchdog on) with and without a ``MetricsExporter`` at the defaults a user gets with
metrics on (a port and a textfile, written every 5 s), measured in pairs (without, with; the
order alternates pair by pair), many short fits: the median of the per-pair ratios of fit times
and their spread. The direct cost, from the fits with metrics: the CPU time of the metrics
threads (HTTP server and textfile writer, their own CPU clocks read before they stop) and the
time inside the exporter's per-step hooks, each as a fraction of the training loop (the first
batch's start to the last batch's end; the fixed set-up and teardown, where stopping the HTTP
server takes up to its 0.5 s poll interval, are printed apart); and the CPU time one
scrape and one textfile write take (``time.thread_time``).

    python bench/bench_metrics_cost.py [--pairs 30] [--steps 300]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _thread_cpu(thread: Any) -> float:
    ident = getattr(thread, "ident", None)
    if ident is None or not thread.is_alive():
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (OSError, AttributeError):
        return 0.0


def fit_seconds(steps: int, folder: Path, metrics: bool, direct: dict[str, float] | None = None,
                control: bool = False) -> float:
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer

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

    loop = [0.0, 0.0]

    class LoopClock(Callback):
        """The training loop alone: the first batch's start to the last batch's end."""

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:
                loop[0] = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loop[1] = time.perf_counter()

    class Empty(Callback):
        """The control arm: one more callback with the exporter's two step hooks, doing nothing."""

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            pass

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            pass

    callbacks: list = [LoopClock(), StallWatchdog(dump_dir=folder / "dumps")] + ([Empty()] if control else [])
    if metrics:
        exporter = MetricsExporter(MetricsConfig(port=_free_port(), address="127.0.0.1",
                                                 textfile=str(folder / "ncclx.prom")))
        hooks = [0.0]
        for name in ("on_train_batch_start", "on_train_batch_end"):
            hook = getattr(exporter, name)

            def timed(*args: Any, _hook: Any = hook) -> None:
                started = time.perf_counter()
                _hook(*args)
                hooks[0] += time.perf_counter() - started

            setattr(exporter, name, timed)

        teardown = exporter.teardown

        def read_threads_then_teardown(*args: Any, **kwargs: Any) -> None:
            """The metrics threads' CPU clocks, read before the exporter stops them (no extra callback:
            Lightning's per-callback dispatch would be counted against the metrics)."""
            server, textfile = exporter._server, exporter._textfile
            cpu = (_thread_cpu(server._thread) if server is not None else 0.0) + \
                (_thread_cpu(textfile._thread) if textfile is not None else 0.0)
            if direct is not None:
                direct.update(threads_cpu=cpu, hooks=hooks[0])
            teardown(*args, **kwargs)

        exporter.teardown = read_threads_then_teardown  # type: ignore[method-assign]
        callbacks.append(exporter)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=folder, callbacks=callbacks)
    data = torch.utils.data.DataLoader(torch.randn(steps, 32), batch_size=1)
    started = time.perf_counter()
    trainer.fit(Tiny(), data)
    whole = time.perf_counter() - started
    if direct is not None:
        direct.update(loop=loop[1] - loop[0], whole=whole)
    return loop[1] - loop[0]


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
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--control", action="store_true",
                        help="also a fit with an empty callback in each round (order rotated): Lightning's own "
                             "per-callback cost, printed as a ratio to the fit without")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    ratios, off, on, threads, hooks, fixed, controls = [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ncclx-metrics-cost-") as tmp:
        fit_seconds(20, Path(tmp) / "warm-off", False)  # imports and first-fit set-up, outside the pairs
        fit_seconds(20, Path(tmp) / "warm-on", True)
        for r in range(args.pairs):
            seconds = {}
            arms: list[Any] = [False, True] + (["control"] if args.control else [])
            shift = r % len(arms)
            arms = arms[shift:] + arms[:shift]
            for metrics in (arms if r % 2 == 0 else arms[::-1]):
                direct: dict[str, float] = {}
                if metrics == "control":
                    seconds[metrics] = fit_seconds(args.steps, Path(tmp) / f"r{r}-c", False, direct, control=True)
                    continue
                seconds[metrics] = fit_seconds(args.steps, Path(tmp) / f"r{r}-{metrics}", metrics, direct)
                fixed.append((metrics, direct["whole"] - direct["loop"]))
                if metrics:
                    threads.append(direct.get("threads_cpu", 0.0) / seconds[metrics])
                    hooks.append(direct.get("hooks", 0.0) / seconds[metrics])
            off.append(seconds[False])
            on.append(seconds[True])
            ratios.append(seconds[True] / seconds[False])
            if "control" in seconds:
                controls.append(seconds["control"] / seconds[False])
        write_cpu, scrape_cpu = cpu_per_call(Path(tmp))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {args.pairs} pairs of {args.steps}-step fits, "
          f"metrics at the defaults (port + textfile every 5 s)")
    print(f"training loop without metrics: median {statistics.median(off):.3f} s; "
          f"with: median {statistics.median(on):.3f} s")
    print("set-up and teardown outside the loop (fit minus loop): median "
          f"{statistics.median(x for m, x in fixed if not m):.3f} s without, "
          f"{statistics.median(x for m, x in fixed if m):.3f} s with metrics")
    print(f"per-pair ratio of training-loop times with/without: median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f})")
    if controls:
        c = statistics.quantiles(controls, n=4) if len(controls) > 1 else [controls[0]] * 3
        print(f"control (an empty callback) / without: median {statistics.median(controls):.3f} "
              f"(quartiles {c[0]:.3f}-{c[2]:.3f})")
    print(f"metrics threads' CPU time / loop time: median {statistics.median(threads) * 100:.3f} % "
          f"(max {max(threads) * 100:.3f} %)")
    print(f"time inside the exporter's step hooks / loop time: median {statistics.median(hooks) * 100:.3f} % "
          f"(per step {statistics.median(hooks) * statistics.median(on) / args.steps * 1e6:.1f} µs)")
    print(f"CPU per textfile write (part + merged file, fsync'd): {write_cpu * 1e3:.2f} ms; "
          f"per scrape (client + server): {scrape_cpu * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
