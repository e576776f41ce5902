"""Register the ncclx strategy names with every Lightning flavour, without importing Lightning.

``import lightning_ncclx`` must stay cheap (Hydra imports it into every app that has the
package installed), yet ``Trainer(strategy="ddp_ncclx")`` must work whichever of
``lightning_ncclx`` and ``lightning`` is imported first. So: a flavour already imported is
registered at once; for the others a post-import hook registers as soon as it is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from types import ModuleType
from typing import Any, Callable

log = logging.getLogger(__name__)

_lock = threading.RLock()
_registered: set[str] = set()
_pending: set[str] = set()


def _register_lightning_pytorch() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_ncclx.strategies import registered_pytorch_strategies

    for cls in registered_pytorch_strategies():
        cls.register_strategies(StrategyRegistry)


def _register_lightning_fabric() -> None:
    from lightning.fabric.strategies import STRATEGY_REGISTRY

    from lightning_ncclx.strategies.fabric import FabricDDPNcclxStrategy

    FabricDDPNcclxStrategy.register_strategies(STRATEGY_REGISTRY)


def _register_pytorch_lightning() -> None:
    from pytorch_lightning.strategies import StrategyRegistry

    from lightning_ncclx.strategies.pytorch_lightning import registered_pl_strategies

    for cls in registered_pl_strategies():
        cls.register_strategies(StrategyRegistry)


REGISTRARS: dict[str, Callable[[], None]] = {
    "lightning.fabric": _register_lightning_fabric,
    "lightning.pytorch": _register_lightning_pytorch,
    "pytorch_lightning": _register_pytorch_lightning,
}


def _run_registrar(module_name: str) -> None:
    with _lock:
        if module_name in _registered:
            return
        _registered.add(module_name)
    try:
        REGISTRARS[module_name]()
    except ImportError as err:
        if "partially initialized" not in str(err):
            log.warning("lightning-ncclx could not register its strategies with %s", module_name, exc_info=True)
            return
        # The plugin's strategy module is itself mid-import (it imported Lightning): the finder runs
        # retry_pending() once it has executed.
        with _lock:
            _registered.discard(module_name)
            _pending.add(module_name)
    except Exception:  # noqa: BLE001 - a broken optional flavour must not break the import of another
        log.warning("lightning-ncclx could not register its strategies with %s", module_name, exc_info=True)


STRATEGY_MODULES = frozenset({
    "lightning_ncclx.strategies.ddp", "lightning_ncclx.strategies.fsdp", "lightning_ncclx.strategies.fsdp2",
    "lightning_ncclx.strategies.fabric", "lightning_ncclx.strategies.pytorch_lightning",
})
"""The plugin's strategy modules: a registration that had to wait for one of them (it was mid-import when
Lightning finished importing) runs once it has executed. Watched here, so that no strategy
module imports this one."""


class _RunAfterExec(importlib.abc.Loader):
    """Wraps a module's real loader and runs ``after`` once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, after: Callable[[], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in STRATEGY_MODULES:
            after: Callable[[], None] = retry_pending
        elif fullname in REGISTRARS and fullname not in _registered:
            after = lambda: _run_registrar(fullname)  # noqa: E731
        else:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RunAfterExec(spec.loader, after)
                return spec
        return None


_finder = _PostImportFinder()


def retry_pending() -> None:
    """Runs after each strategy module has executed: registers what had to wait for it."""
    with _lock:
        waiting = sorted(_pending)
        _pending.clear()
    for module_name in waiting:
        _run_registrar(module_name)


def install() -> None:
    """Register now with the flavours already imported, and on import with the others."""
    for module_name in REGISTRARS:
        module = sys.modules.get(module_name)
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            _run_registrar(module_name)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
