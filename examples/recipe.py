"""What the example Hydra apps share: build model, data, callbacks and Trainer from the composed
config and fit. ``train_fsdp.py`` and ``train_ddp.py`` differ only in their primary config."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("examples.recipe")
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
EXIT_BAD_CONFIG = 2


def find_ncclx_error(error: BaseException) -> BaseException | None:
    """The NcclxError behind ``error`` (Hydra's instantiate wraps what a constructor raises)."""
    from lightning_ncclx.errors import NcclxError

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, NcclxError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def run(cfg: DictConfig) -> None:
    import lightning_ncclx  # noqa: F401  - registers the strategy names
    from hydra.utils import instantiate
    from lightning.pytorch import seed_everything

    from lightning_ncclx.config import ncclx_config_from

    ncclx_config_from(cfg.get("ncclx"))  # range and cross-field checks now, before any rank starts
    seed_everything(cfg.seed, workers=True)
    callbacks: list[Any] = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if cfg.get("fault") is not None:
        from faults import FaultInjector

        callbacks.append(FaultInjector(**OmegaConf.to_container(cfg.fault, resolve=True)))
    trainer = instantiate(cfg.trainer, callbacks=callbacks)
    model = instantiate(cfg.model)
    data = instantiate(cfg.data)
    trainer.fit(model, datamodule=data)
    if trainer.global_rank == 0:
        strategy = trainer.strategy
        print(f"done: {trainer.global_step} steps with {type(strategy).__name__}; "
              f"dumps -> {getattr(strategy, 'ncclx_dump_dir', None)}", flush=True)


def run_guarded(cfg: DictConfig) -> None:
    """``run`` with bad configuration reported as one line and exit code 2 (no traceback)."""
    try:
        run(cfg)
    except Exception as error:  # noqa: BLE001
        found = find_ncclx_error(error)
        if found is None:
            raise
        print(f"error: {found}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_CONFIG)
