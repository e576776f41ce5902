"""Typed Hydra configs: ``NcclxConfig`` is the schema of the ``ncclx`` config group.

``register_configs()`` stores the schema as ``ncclx/ncclx_schema`` in Hydra's ConfigStore; the
packaged ``ncclx/default.yaml`` lists it first in its defaults, so a typo'd key or a value of
the wrong type fails at compose time with Hydra's own message naming the key::

    $ python train.py ncclx.flight_recorder.buffer_size=abc
    Error merging override ncclx.flight_recorder.buffer_size=abc
    Value 'abc' of type 'str' could not be converted to Integer
        full_key: ncclx.flight_recorder.buffer_size

The search-path plugin (``hydra_plugins/lightning_ncclx_searchpath``) calls this at Hydra
start-up; call it yourself before ``hydra.compose``/``@hydra.main`` only where that plugin is not
installed. Imports neither torch nor Lightning. Note: with OmegaConf, ``__post_init__`` checks
(ranges, cross-field rules) run only when the config is converted: use
``lightning_ncclx.config.ncclx_config_from(cfg.ncclx)``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lightning_ncclx.config import NcclxConfig

SCHEMA_GROUP = "ncclx"
SCHEMA_NAME = "ncclx_schema"
_registered = False


def register_configs() -> None:
    """Store ``NcclxConfig`` as ``ncclx/ncclx_schema`` in Hydra's ConfigStore (idempotent)."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group=SCHEMA_GROUP, name=SCHEMA_NAME, node=NcclxConfig, provider="lightning_ncclx")
    _registered = True


def packaged_conf_dir() -> Path | None:
    """``lightning_ncclx/conf`` (groups ``ncclx`` and ``strategy``), found without importing anything
    heavier than this module."""
    spec = importlib.util.find_spec("lightning_ncclx")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "conf"
        if folder.is_dir():
            return folder
    return None
