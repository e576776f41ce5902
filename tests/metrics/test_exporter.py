"""Metrics are off by default and cost nothing then (prometheus_client is not even imported);
on, the strategy adds one exporter whose ``/metrics`` a real Trainer's fit serves."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from lightning_ncclx.config import MetricsConfig, ncclx_config_from
from support import clean_env, free_port


def test_off_by_default_nothing_is_attached_or_imported() -> None:
    code = ("import sys\nfrom lightning.pytorch import Trainer\n"
            "from lightning_ncclx.config import NcclxConfig\n"
            "from lightning_ncclx.strategies.callbacks import attach_default_watchdog\n"
            "t = Trainer(accelerator='cpu', devices=1, logger=False, enable_checkpointing=False)\n"
            "attach_default_watchdog(t, NcclxConfig(), None)\n"
            "names = [type(c).__name__ for c in t.callbacks]\n"
            "assert 'MetricsExporter' not in names, names\n"
            "assert 'prometheus_client' not in sys.modules and 'lightning_ncclx.metrics' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_strategy_adds_one_exporter_when_a_port_is_set() -> None:
    from lightning.pytorch import Trainer

    from lightning_ncclx.metrics import MetricsExporter
    from lightning_ncclx.strategies.callbacks import attach_default_watchdog

    ncclx = ncclx_config_from({"metrics": {"port": 9400}})
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    attach_default_watchdog(trainer, ncclx, None)
    attach_default_watchdog(trainer, ncclx, None)
    assert [type(c) for c in trainer.callbacks].count(MetricsExporter) == 1


def test_a_one_rank_fit_serves_its_metrics(tmp_path: Path) -> None:
    import torch
    from lightning.pytorch import LightningModule, Trainer

    from lightning_ncclx.metrics import MetricsExporter
    from lightning_ncclx.watchdog import StallWatchdog

    port = free_port()
    seen: list[str] = []

    class Scraping(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):  # noqa: ANN001
            if batch_idx == 3:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                    seen.append(answer.read().decode())
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=5, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path,
                      callbacks=[StallWatchdog(dump_dir=tmp_path / "dumps"),
                                 MetricsExporter(MetricsConfig(port=port, address="127.0.0.1"))])
    trainer.fit(Scraping(), torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=1))
    families = {f.name: f for f in text_string_to_metric_families(seen[0])}
    assert families["ncclx_global_step"].samples[0].value == 3.0
    assert families["ncclx_watchdog_up"].samples[0].value == 1.0
    labels = families["ncclx_step_seconds"].samples[0].labels
    assert labels == {"rank": "0", "local_rank": "0", "host": labels["host"]}
    try:  # the server is gone after the fit
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the metrics server outlived the fit")
    except OSError:
        pass
