"""The packaged ``alerts`` group: ``+alerts=webhook``, ``+alerts=pagerduty`` and ``+alerts=stragglers`` compose into
``ncclx.alerts`` of the examples' apps and build a valid config (names of variables, no secret)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lightning_ncclx.config import ncclx_config_from

REPO = Path(__file__).resolve().parents[2]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    sys.path.insert(0, str(REPO / "examples"))
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return compose(config_name="train_ddp", overrides=overrides)
    finally:
        sys.path.remove(str(REPO / "examples"))
        GlobalHydra.instance().clear()


@pytest.mark.parametrize(("recipe", "sink", "variable"), [
    ("webhook", "webhook", "NCCLX_ALERT_WEBHOOK_URL"),
    ("pagerduty", "pagerduty", "NCCLX_PAGERDUTY_ROUTING_KEY"),
])
def test_an_alerts_recipe_turns_alerts_on_with_a_variable_name(recipe: str, sink: str, variable: str) -> None:
    config = ncclx_config_from(_compose([f"+alerts={recipe}"]).ncclx)
    assert config.alerts.enabled and config.alerts.has_sink
    assert variable in (config.alerts.webhook.url_env, config.alerts.pagerduty.routing_key_env)


def test_both_recipes_at_once_and_an_override() -> None:
    cfg = _compose(["+alerts=[webhook,pagerduty]", "ncclx.alerts.pagerduty.severity=error"])
    config = ncclx_config_from(cfg.ncclx)
    assert config.alerts.webhook.url_env and config.alerts.pagerduty.routing_key_env
    assert config.alerts.pagerduty.severity == "error"


def test_without_a_recipe_alerts_stay_off() -> None:
    assert not ncclx_config_from(_compose([]).ncclx).alerts.enabled


def test_the_stragglers_recipe_adds_straggler_warnings_to_a_sink() -> None:
    config = ncclx_config_from(_compose(["+alerts=[webhook,stragglers]"]).ncclx).alerts
    assert config.enabled and config.has_sink and config.stragglers
    assert config.straggler_min_interval_seconds == 600.0
