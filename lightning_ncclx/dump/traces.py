"""Snapshot torch's flight recorder of every backend this rank uses.

Safe to call from the watchdog thread while the main thread is blocked inside a collective: a
blocked ``work.wait()`` releases the GIL and the recorder has its own lock.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from typing import Any

from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.backend import torch_api

log = logging.getLogger(__name__)

# Backend implementation name -> the name the recorder's ring buffer is kept under.
_FR_BUFFER_NAMES = {
    "gloo": "gloo",
    "nccl2": "nccl2",
    "nccl-lazy": "nccl-lazy",
    "xccl": "xccl",
}
_LEGACY_NCCL_NAMES = ("nccl", "nccl-legacy")


@dataclass(frozen=True)
class BackendInUse:
    """One backend implementation serving a device of at least one process group."""

    device: str
    """``cpu`` or ``cuda``."""
    name: str
    """The implementation's own ``name()``: ``gloo``, ``nccl2``, ``NCCL`` (legacy) ..."""

    @property
    def file_tag(self) -> str:
        """The ``<backend>`` part of ``rank_<R>.<backend>.fr.pkl``."""
        lowered = self.name.lower()
        return "nccl" if lowered in _LEGACY_NCCL_NAMES else lowered


def _device_backend_pairs() -> list[BackendInUse]:
    import torch

    cuda = torch.cuda.is_available()
    pairs: list[BackendInUse] = []
    for group in torch_api.member_groups():
        for device, backend in torch_api.group_backends(group):
            if device.type == "cuda" and not cuda:
                continue  # gloo registers itself for cuda on CUDA builds even without a GPU
            try:
                name = str(backend.name())
            except Exception:  # noqa: BLE001 - a backend that cannot name itself is not dumped
                continue
            pairs.append(BackendInUse(device=device.type, name=name))
    return pairs


def backends_in_use() -> list[BackendInUse]:
    """Every backend implementation across this rank's process groups, one per recorder."""
    found: dict[str, BackendInUse] = {}
    for item in _device_backend_pairs():
        found.setdefault(item.file_tag, item)
    return list(found.values())


def device_backends() -> dict[str, str]:
    """``{"cpu": "gloo", "cuda": "nccl2"}`` (context.json ``backends``)."""
    out: dict[str, str] = {}
    for item in _device_backend_pairs():
        out.setdefault(item.device, item.file_tag)
    return out


def real_pg_config() -> dict[str, dict[str, Any]]:
    """``{pg_name: {"name", "desc", "ranks"}}`` from torch's table of groups (ranks as a list)."""
    return {g.name: {"name": g.name, "desc": g.desc, "ranks": list(g.ranks)} for g in torch_api.group_members()}


def _raw_dump(item: BackendInUse, stack_traces: bool) -> bytes:
    if item.file_tag == "nccl":
        return torch_api.dump_nccl_trace(True, stack_traces, False)
    return torch_api.dump_fr_trace(True, stack_traces, False, _FR_BUFFER_NAMES.get(item.file_tag, item.file_tag))


def fix_pg_config(trace: dict[str, Any], pg_config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Replace gloo's broken ``pg_config`` (a single ``""`` key) with the real one; keep the
    original under ``pg_config_raw``. Ranks are written as a string, as torch writes them."""
    trace = dict(trace)
    trace["pg_config_raw"] = trace.get("pg_config")
    trace["pg_config"] = {
        name: {"name": entry["name"], "desc": entry["desc"], "ranks": str(list(entry["ranks"]))}
        for name, entry in pg_config.items()
    }
    return trace


def dump_traces(stack_traces: bool = True) -> dict[str, bytes]:
    """``{file_tag: pickle bytes}`` for every backend in use; a backend that fails is logged and
    skipped (a partial dump beats none)."""
    out: dict[str, bytes] = {}
    pg_config: dict[str, dict[str, Any]] | None = None
    for item in backends_in_use():
        try:
            raw = _raw_dump(item, stack_traces)
            if item.file_tag == "gloo":
                if pg_config is None:
                    pg_config = real_pg_config()
                raw = pickle.dumps(fix_pg_config(safe_loads(raw), pg_config))
            out[item.file_tag] = raw
        except Exception:  # noqa: BLE001 - never let a dump failure reach training
            log.warning("flight-recorder dump of backend %s failed", item.name, exc_info=True)
    return out
