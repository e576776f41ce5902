"""Fixtures of the multi-host tests: two network-namespace "hosts", always torn down."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from multihost.netns import TwoHosts, unavailable_reason

_REASON: list[str | None] = []


def _reason() -> str | None:
    if not _REASON:
        _REASON.append(unavailable_reason())
    return _REASON[0]


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[TwoHosts]:
    """Two namespaces joined by a veth pair, unique names per test; every process started in
    them is killed and both namespaces (and the veth pair) are deleted, whatever happens."""
    reason = _reason()
    if reason is not None:
        pytest.skip(f"multi-host test needs network namespaces: {reason}")
    hosts = TwoHosts(tmp_path)
    try:
        hosts.create()
    except Exception as err:  # noqa: BLE001
        problems = hosts.destroy()
        pytest.skip(f"could not create the two namespaces: {err} {getattr(err, 'stderr', '')}; cleanup: {problems}")
    try:
        yield hosts
    finally:
        problems = hosts.destroy()
        assert not problems, f"multi-host cleanup left something behind: {problems}"
