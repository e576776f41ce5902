"""``ncclx.alerts``: off by default, names of environment variables only, never a secret echoed."""

from __future__ import annotations

import pytest

from lightning_ncclx.config import AlertsConfig, NcclxConfig, ncclx_config_from
from lightning_ncclx.errors import ConfigError


def test_alerts_are_off_by_default_and_build_no_notifier() -> None:
    config = NcclxConfig().alerts
    assert not config.enabled and not config.has_sink


@pytest.mark.parametrize("value", ["https://hooks.slack.com/services/T000/B000/XXXXsecret", "1ABC", "A-B", ""])
def test_a_value_where_a_variable_name_belongs_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(ConfigError) as failure:
        ncclx_config_from({"alerts": {"enabled": True, "webhook": {"url_env": value}}})
    assert "ncclx.alerts.webhook.url_env" in str(failure.value) and (not value or value not in str(failure.value))
    with pytest.raises(ConfigError, match="routing_key_env"):
        AlertsConfig(pagerduty={"routing_key_env": value})


@pytest.mark.parametrize(("key", "value"), [("attempts", 0), ("deadline_seconds", 0.0), ("command", " "),
                                            ("attempt_timeout_seconds", float("inf")),
                                            ("straggler_min_interval_seconds", -1.0),
                                            ("straggler_min_interval_seconds", float("inf")),
                                            ("straggler_min_interval_seconds", 8 * 24 * 3600.0),
                                            ("straggler_min_interval_seconds", True),
                                            ("stragglers", "yes"), ("confirm_seconds", 0.0)])
def test_bounds_are_checked(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"ncclx.alerts.{key}"):
        AlertsConfig(**{key: value})


def test_a_mapping_becomes_the_typed_config() -> None:
    config = ncclx_config_from({"alerts": {"enabled": True, "webhook": {"url_env": "SLACK_URL"},
                                           "pagerduty": {"routing_key_env": "PD_KEY", "severity": "warning"}}})
    assert config.alerts.webhook.url_env == "SLACK_URL" and config.alerts.pagerduty.severity == "warning"
    assert config.alerts.has_sink


def test_the_strategy_hands_ncclx_alerts_to_its_watchdog(tmp_path) -> None:  # noqa: ANN001
    from lightning.pytorch import Trainer

    from lightning_ncclx.strategies.callbacks import attach_default_watchdog

    ncclx = ncclx_config_from({"alerts": {"enabled": True, "command": "true"}})
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      default_root_dir=tmp_path)
    watchdog = attach_default_watchdog(trainer, ncclx, tmp_path)
    assert watchdog.alerts is ncclx.alerts


def test_a_watchdog_the_user_added_learns_ncclx_alerts_unless_it_has_its_own(tmp_path) -> None:  # noqa: ANN001
    from lightning.pytorch import Trainer

    from lightning_ncclx.strategies.callbacks import attach_default_watchdog
    from lightning_ncclx.watchdog import StallWatchdog

    ncclx = ncclx_config_from({"alerts": {"enabled": True, "command": "true"}})
    own = AlertsConfig(enabled=True, command="false")
    for given, expected in ((None, ncclx.alerts), (own, own)):
        watchdog = StallWatchdog(alerts=given)
        trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                          default_root_dir=tmp_path, callbacks=[watchdog])
        assert attach_default_watchdog(trainer, ncclx, tmp_path) is watchdog
        assert watchdog.alerts is expected


def test_straggler_warnings_are_off_by_default_and_zero_means_one_per_episode() -> None:
    assert not AlertsConfig().stragglers and AlertsConfig().straggler_min_interval_seconds == 600.0
    assert AlertsConfig(stragglers=True, straggler_min_interval_seconds=0).straggler_min_interval_seconds == 0


def test_the_strategy_hands_ncclx_alerts_to_its_straggler_detector(tmp_path) -> None:  # noqa: ANN001
    from lightning.pytorch import Trainer

    from lightning_ncclx.straggler import StragglerDetector
    from lightning_ncclx.strategies.callbacks import attach_default_straggler_detector

    ncclx = ncclx_config_from({"alerts": {"enabled": True, "stragglers": True, "command": "true"}})
    own = AlertsConfig(enabled=True, command="false")
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, default_root_dir=tmp_path)
    assert attach_default_straggler_detector(trainer, ncclx, tmp_path).alerts is ncclx.alerts
    for given, expected in ((None, ncclx.alerts), (own, own)):
        detector = StragglerDetector(alerts=given)
        trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                          default_root_dir=tmp_path, callbacks=[detector])
        assert attach_default_straggler_detector(trainer, ncclx, tmp_path) is detector
        assert detector.alerts is expected
