"""Zero-code adoption through Lightning's external-callbacks entry points.

``pyproject.toml`` registers :func:`lightning_callbacks` under ``lightning.pytorch.callbacks_factory``
and :func:`pytorch_lightning_callbacks` under ``pytorch_lightning.callbacks_factory``; Lightning calls
them in every ``Trainer(...)``. They return nothing unless ``LIGHTNING_NCCLX_WATCH`` asks for it,
so an installed package changes no job by itself::

    LIGHTNING_NCCLX_WATCH=1 python train.py        # stall watchdog + straggler detection
    LIGHTNING_NCCLX_WATCH=straggler python train.py
    LIGHTNING_NCCLX_WATCH=1 LIGHTNING_NCCLX_OVERRIDES="straggler.interval_steps=50 watchdog.train_step_seconds=120" \
        python train.py                            # settings as Hydra-style ``ncclx.`` overrides

With it, the Trainer gets one small callback that, in ``setup`` (the process group exists then),
adds a ``StallWatchdog`` and a ``StragglerDetector`` with default settings unless the job already
has them (its own, or the ones an ncclx strategy brings). Before the process group exists it also
exports the flight-recorder variables the user has not set, so stall dumps hold collective traces.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

WATCH_VARIABLE = "LIGHTNING_NCCLX_WATCH"
OVERRIDES_VARIABLE = "LIGHTNING_NCCLX_OVERRIDES"
FEATURES = ("watchdog", "straggler")
_ON = ("1", "true", "yes", "on", "all")
_OFF = ("", "0", "false", "no", "off", "none")


def features_from_environment(environ: Any = None) -> tuple[str, ...]:
    """What ``LIGHTNING_NCCLX_WATCH`` switches on: ``1``/``all`` both, or a comma list of
    ``watchdog``/``straggler``; unset or ``0`` nothing. An unknown word is warned about and ignored."""
    raw = (os.environ if environ is None else environ).get(WATCH_VARIABLE, "").strip().lower()
    if raw in _OFF:
        return ()
    if raw in _ON:
        return FEATURES
    words = [w.strip() for w in raw.split(",") if w.strip()]
    unknown = [w for w in words if w not in FEATURES]
    if unknown:
        log.warning("%s=%r: ignoring %s (expected 1, 0, or a comma list of %s)", WATCH_VARIABLE, raw,
                    ", ".join(unknown), ", ".join(FEATURES))
    return tuple(f for f in FEATURES if f in words)


def config_from_environment(environ: Any = None) -> Any:
    """``NcclxConfig`` with the ``key=value`` overrides of ``LIGHTNING_NCCLX_OVERRIDES`` (space
    separated, keys below ``ncclx.``); a bad key or value raises ``ConfigError`` naming it."""
    import shlex

    from lightning_ncclx.config import ncclx_config_from
    from lightning_ncclx.errors import ConfigError

    raw = (os.environ if environ is None else environ).get(OVERRIDES_VARIABLE, "").strip()
    if not raw:
        return ncclx_config_from(None)
    from omegaconf import OmegaConf

    items = shlex.split(raw)
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ConfigError(f"{OVERRIDES_VARIABLE}: {bad} is not key=value (e.g. straggler.interval_steps=50)")
    return ncclx_config_from(OmegaConf.to_container(OmegaConf.from_dotlist(items), resolve=True))


def lightning_callbacks() -> list[Any]:
    """Entry point of ``lightning.pytorch.callbacks_factory``."""
    return _callbacks()


def pytorch_lightning_callbacks() -> list[Any]:
    """Entry point of ``pytorch_lightning.callbacks_factory``."""
    return _callbacks()


def _callbacks() -> list[Any]:
    from lightning_ncclx.errors import ConfigError

    features = features_from_environment()
    if not features:
        return []
    config = config_from_environment()  # a ConfigError is raised: the user asked for these settings
    try:
        if "watchdog" in features:
            _export_recorder_variables(config)
        from lightning_ncclx.zero_code_callback import EnvironmentAdoption

        return [EnvironmentAdoption(features, config)]
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - a broken add-on must not stop the user's Trainer
        log.warning("%s is set but lightning-ncclx could not add its callbacks", WATCH_VARIABLE, exc_info=True)
        return []


def _export_recorder_variables(ncclx: Any) -> None:
    """Before the process group exists: the recorder's variables, the user's own values first."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    from lightning_ncclx.backend.recorder_env import apply_recorder_env
    from dataclasses import replace

    from lightning_ncclx.config import EnvPrecedence
    from lightning_ncclx.dump.location import resolve_dump_dir, torch_dump_prefix

    config = replace(ncclx.flight_recorder, env_precedence=EnvPrecedence.environment)
    prefix = torch_dump_prefix(resolve_dump_dir(config.dump_dir, None), config.torch_dump_prefix)
    apply_recorder_env(config, prefix)
