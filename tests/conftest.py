"""Test-wide hygiene: every test gets back the environment it started with, and no process group
survives a test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _restore_environment_and_process_group():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
