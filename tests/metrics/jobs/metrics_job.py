"""The watchdog tests' job (``tests/watchdog/jobs/train_job.py``, same arguments) with a
``MetricsExporter(MetricsConfig(**json.loads($NCCLX_TEST_METRICS)))`` after its other callbacks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "watchdog" / "jobs"))

from lightning.pytorch import Trainer  # noqa: E402

from lightning_ncclx.config import MetricsConfig  # noqa: E402
from lightning_ncclx.metrics import MetricsExporter  # noqa: E402

import train_job  # noqa: E402


def trainer_with_metrics(*args, **kwargs) -> Trainer:  # noqa: ANN002, ANN003
    exporter = MetricsExporter(MetricsConfig(**json.loads(os.environ["NCCLX_TEST_METRICS"])))
    kwargs["callbacks"] = list(kwargs.get("callbacks") or []) + [exporter]
    return Trainer(*args, **kwargs)


train_job.Trainer = trainer_with_metrics

if __name__ == "__main__":
    sys.exit(train_job.main())
