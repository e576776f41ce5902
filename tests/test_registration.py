"""How ``registration.py`` registers the strategy names, in this process: each Lightning flavour's
registrar runs once; one that failed because the plugin's own strategy module was mid-import is retried
once that module has executed; any other failure is logged and never breaks the import; the
post-import hook fires only for the modules it watches and runs after the module executed.

The registrars are stand-ins (counting functions) under made-up module names, imported for
real from ``tmp_path``; the end-to-end check with the real Lightning flavours, in fresh
interpreters, is ``tests/test_package.py``."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import pytest

from lightning_ncclx import registration  # importing the package installs the finder

FLAVOUR = "ncclx_test_fake_flavour"
STRATEGY = "ncclx_test_fake_strategy"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Empty bookkeeping, a folder on sys.path for made-up modules, and none of them left imported."""
    monkeypatch.setattr(registration, "_registered", set())
    monkeypatch.setattr(registration, "_pending", set())
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    for name in (FLAVOUR, STRATEGY):
        sys.modules.pop(name, None)


def test_a_registrar_runs_once_however_often_it_is_asked(fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(registration.REGISTRARS, FLAVOUR, lambda: calls.append("run"))
    registration._run_registrar(FLAVOUR)
    registration._run_registrar(FLAVOUR)
    registration.retry_pending()
    assert calls == ["run"]
    assert registration._registered == {FLAVOUR} and registration._pending == set()


def test_a_flavour_imported_while_our_strategy_module_is_mid_import_is_retried_once(
        fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def registrar() -> None:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise ImportError("cannot import name 'X' from partially initialized module 'lightning_ncclx.strategies.ddp'")

    monkeypatch.setitem(registration.REGISTRARS, FLAVOUR, registrar)
    registration._run_registrar(FLAVOUR)
    assert registration._pending == {FLAVOUR} and FLAVOUR not in registration._registered
    registration.retry_pending()
    assert attempts == [0, 1]
    assert registration._registered == {FLAVOUR} and registration._pending == set()
    registration.retry_pending()
    assert attempts == [0, 1]  # done: not again


@pytest.mark.parametrize("error", [ImportError("No module named 'lightning.pytorch.strategies'"),
                                   RuntimeError("registry broken")])
def test_any_other_failure_is_logged_and_not_retried(fresh, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture, error: Exception) -> None:
    attempts: list[int] = []

    def registrar() -> None:
        attempts.append(1)
        raise error

    monkeypatch.setitem(registration.REGISTRARS, FLAVOUR, registrar)
    with caplog.at_level(logging.WARNING, logger="lightning_ncclx.registration"):
        registration._run_registrar(FLAVOUR)  # does not raise
    registration.retry_pending()
    assert attempts == [1] and registration._pending == set()
    assert [r.getMessage() for r in caplog.records] == [
        f"lightning-ncclx could not register its strategies with {FLAVOUR}"]


def test_importing_a_watched_flavour_registers_after_the_module_has_executed(
        fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    (fresh / f"{FLAVOUR}.py").write_text("REGISTRY = {}\n")
    seen: list[object] = []
    monkeypatch.setitem(registration.REGISTRARS, FLAVOUR, lambda: seen.append(dict(sys.modules[FLAVOUR].REGISTRY)))
    module = importlib.import_module(FLAVOUR)
    assert seen == [{}]  # ran once, with the module's body already executed
    assert FLAVOUR in registration._registered
    loader = module.__spec__.loader
    assert isinstance(loader, registration._RunAfterExec)
    assert loader.get_filename(FLAVOUR) == str(fresh / f"{FLAVOUR}.py")  # everything else reaches the real loader


def test_importing_one_of_our_strategy_modules_runs_the_registrations_that_waited_for_it(
        fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    (fresh / f"{STRATEGY}.py").write_text("READY = True\n")
    ran: list[bool] = []
    monkeypatch.setitem(registration.REGISTRARS, FLAVOUR, lambda: ran.append(sys.modules[STRATEGY].READY))
    monkeypatch.setattr(registration, "STRATEGY_MODULES", registration.STRATEGY_MODULES | {STRATEGY})
    registration._pending.add(FLAVOUR)
    importlib.import_module(STRATEGY)
    assert ran == [True] and registration._pending == set() and FLAVOUR in registration._registered


def test_the_finder_leaves_other_modules_and_registered_flavours_alone(fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    finder = registration._finder
    assert finder.find_spec("json", None) is None
    (fresh / f"{FLAVOUR}.py").write_text("")
    monkeypatch.setitem(registration.REGISTRARS, FLAVOUR, lambda: None)
    spec = finder.find_spec(FLAVOUR, None)
    assert spec is not None and isinstance(spec.loader, registration._RunAfterExec)
    registration._registered.add(FLAVOUR)
    assert finder.find_spec(FLAVOUR, None) is None  # already registered: the normal import machinery
    assert finder.find_spec("ncclx_test_no_such_module", None) is None


def test_install_registers_flavours_already_imported_and_hooks_the_rest_once(
        fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(registration.REGISTRARS, "json", lambda: calls.append("json"))  # imported already
    monkeypatch.setitem(registration.REGISTRARS, FLAVOUR, lambda: calls.append(FLAVOUR))  # not imported
    registration.install()
    registration.install()
    assert calls == ["json"]
    assert sys.meta_path.count(registration._finder) == 1
