"""Puts lightning-ncclx's packaged config groups (``ncclx``, ``strategy``) on the search path of
every Hydra app in this environment, and registers the ``ncclx`` schema in the ConfigStore.

Hydra imports every module under ``hydra_plugins`` at the start of every app, so this file
must stay cheap: the folder is found with ``importlib.util.find_spec`` (a ``file://`` path;
``pkg://lightning_ncclx.conf`` would import the package's parent chain at every start), and
nothing here imports torch or Lightning.

In your own app::

    defaults:
      - strategy: null        # then: python my_app.py strategy=fsdp_ncclx
      - _self_
    # or without that slot: python my_app.py +strategy=fsdp_ncclx ncclx.watchdog.train_step_seconds=120
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "lightning-ncclx"


class LightningNcclxSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        try:  # `import lightning_ncclx` is cheap: no torch, no Lightning
            from lightning_ncclx.hydra_store import packaged_conf_dir, register_configs
        except ImportError:  # a broken install must not break unrelated Hydra apps
            return
        folder = packaged_conf_dir()
        if folder is None:
            return
        search_path.append(provider=PROVIDER, path=f"file://{folder}")
        register_configs()
