"""``ncclx.straggler``: checks naming the key, the Hydra default, and the strategy's default
detector that never doubles a user's own."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_ncclx.config import NcclxConfig, StragglerConfig, ncclx_config_from
from lightning_ncclx.errors import ConfigError
from lightning_ncclx.strategies.callbacks import attach_default_straggler_detector


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"interval_steps": 1}, r"ncclx.straggler.interval_steps=1 is not valid: expected an integer >= 2"),
        ({"threshold": 1.0}, r"ncclx.straggler.threshold=1.0 is not valid: expected a ratio greater than 1.0"),
        ({"patience": 0}, r"ncclx.straggler.patience=0 is not valid"),
        ({"poll_interval_seconds": 0}, r"ncclx.straggler.poll_interval_seconds=0 is not valid"),
    ],
)
def test_bad_values_name_the_key(values: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ncclx_config_from({"straggler": values})


def test_defaults_and_off_switch() -> None:
    assert NcclxConfig().straggler == StragglerConfig(enabled=True, interval_steps=100, threshold=1.2, patience=3)
    assert ncclx_config_from({"straggler": {"enabled": False}}).straggler.enabled is False




def test_default_detector_is_added_once_and_a_users_own_is_kept(tmp_path: Path) -> None:
    from lightning_ncclx.straggler import StragglerDetector

    trainer = SimpleNamespace(callbacks=[])
    first = attach_default_straggler_detector(trainer, NcclxConfig(), tmp_path)
    assert attach_default_straggler_detector(trainer, NcclxConfig(), tmp_path) is first
    assert trainer.callbacks == [first] and first.dump_dir == tmp_path
    own = StragglerDetector(StragglerConfig(interval_steps=7))
    trainer = SimpleNamespace(callbacks=[own])
    assert attach_default_straggler_detector(trainer, NcclxConfig(), tmp_path) is own
    assert trainer.callbacks == [own] and own.config.interval_steps == 7 and own.dump_dir == tmp_path


def test_detector_pickles_without_its_thread() -> None:
    import pickle

    from lightning_ncclx.straggler import StragglerDetector

    detector = StragglerDetector(StragglerConfig(interval_steps=9))
    detector._runtime = object()  # stands for a running thread: must not cross the pickle
    clone = pickle.loads(pickle.dumps(detector))
    assert clone.runtime is None and clone.config.interval_steps == 9
