"""What one rank writes into an event folder: traces, Python stacks and ``context.json``.

Every file is written atomically (temporary file + ``os.replace``) so a reader never sees half a
file, even when the job is killed mid-dump. Layout and schema: ``docs/dump-format.md``.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from lightning_ncclx.backend.torch_api import nccl_version
from lightning_ncclx.dump import traces
from lightning_ncclx.dump.p2p_ops import p2p_in_flight
from lightning_ncclx.files import atomic_write_bytes, atomic_write_text
from lightning_ncclx.layout import CONTEXT_SUFFIX, STACKS_SUFFIX, rank_file, trace_file

log = logging.getLogger(__name__)

CONTEXT_SCHEMA = "lightning-ncclx/context/1"
_RECORDER_ENV_PREFIXES = ("TORCH_FR_", "TORCH_NCCL_", "NCCL_DEBUG", "TORCH_DIST_USE_NCCL2")


def format_stacks() -> str:
    """Python stacks of every thread of this process, named."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines: list[str] = [f"# Python stacks, pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"]
    for ident, frame in sys._current_frames().items():
        lines.append(f"\n--- thread {names.get(ident, '?')!r} (id {ident}) ---\n")
        lines.extend(traceback.format_stack(frame))
    return "".join(lines)


def recorder_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith(_RECORDER_ENV_PREFIXES)}


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"torch_version": None, "nccl_version": None, "lightning_version": None}
    try:
        import torch

        out["torch_version"] = torch.__version__
        if torch.cuda.is_available():
            out["nccl_version"] = nccl_version()
    except Exception:  # noqa: BLE001
        pass
    for module in ("lightning", "pytorch_lightning"):
        if module in sys.modules:
            out["lightning_version"] = getattr(sys.modules[module], "__version__", None)
            break
    return out


def cuda_index(device: Any) -> int | None:
    """The CUDA device index of a ``torch.device`` (a rank's root device), else None. The
    watchdog thread reads memory with it: that thread's own current device is cuda:0."""
    if getattr(device, "type", None) != "cuda":
        return None
    index = getattr(device, "index", None)
    return int(index) if isinstance(index, int) else 0


def _cuda_memory(device: int | None) -> dict[str, int] | None:
    try:
        import torch

        if device is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return {
            "device": device,
            "allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
        }
    except Exception:  # noqa: BLE001
        return None


def _process_identity() -> dict[str, Any]:
    env = os.environ
    out: dict[str, Any] = {"rank": None, "world_size": None}
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            out["rank"], out["world_size"] = dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    if out["rank"] is None:
        out["rank"] = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
        out["world_size"] = int(env.get("WORLD_SIZE", "1"))
    out["local_rank"] = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
    out["node_rank"] = int(env.get("NODE_RANK", env.get("GROUP_RANK", env.get("SLURM_NODEID", "0"))))
    return out


def host_name() -> str:
    return socket.gethostname() or platform.node() or "unknown-host"


def write_rank_dump(
    folder: Path,
    *,
    event: str,
    reason: str,
    initiator_rank: int | None,
    progress: Mapping[str, Any],
    stack_traces: bool = True,
    exception: str | None = None,
    cuda_device: int | None = None,
) -> list[Path]:
    """Write this rank's traces, stacks and context into ``folder``; returns the files written.

    ``progress`` carries the watchdog's view: phase, step, global_step,
    seconds_since_heartbeat, stall_threshold_seconds. Each part that fails is logged and skipped.
    """
    identity = _process_identity()
    rank = int(identity["rank"])
    written: list[Path] = []
    trace_files: list[str] = []
    try:
        for tag, data in traces.dump_traces(stack_traces=stack_traces).items():
            name = trace_file(rank, tag)
            written.append(atomic_write_bytes(folder / name, data))
            trace_files.append(name)
    except Exception:  # noqa: BLE001
        log.warning("[rank %s] writing flight-recorder traces failed", rank, exc_info=True)
    stacks_name = rank_file(rank, STACKS_SUFFIX)
    try:
        written.append(atomic_write_text(folder / stacks_name, format_stacks()))
    except Exception:  # noqa: BLE001
        log.warning("[rank %s] writing Python stacks failed", rank, exc_info=True)
        stacks_name = None  # type: ignore[assignment]
    context: dict[str, Any] = {
        "schema": CONTEXT_SCHEMA,
        "event": event,
        "reason": reason,
        "initiator_rank": initiator_rank,
        **identity,
        "host": host_name(),
        "pid": os.getpid(),
        "phase": progress.get("phase"),
        "step": progress.get("step"),
        "global_step": progress.get("global_step"),
        "seconds_since_heartbeat": progress.get("seconds_since_heartbeat"),
        "stall_threshold_seconds": progress.get("stall_threshold_seconds"),
        "time_unix": time.time(),
        **_versions(),
        "backends": _safe(traces.device_backends, {}),
        "flight_recorder": recorder_environment(),
        "pg_config": _safe(traces.real_pg_config, {}),
        "trace_files": trace_files,
        "stacks_file": stacks_name,
        "exception": exception,
        "cuda_memory": _cuda_memory(cuda_device),
        "p2p_in_flight": _safe(p2p_in_flight, []),
    }
    for key in ("stall_events", "last_stall_event", "detection", "store_lost"):
        if key in progress:
            context[key] = progress[key]
    try:
        text = json.dumps(context, indent=2, sort_keys=False, default=str)
        written.append(atomic_write_text(folder / rank_file(rank, CONTEXT_SUFFIX), text))
    except Exception:  # noqa: BLE001
        log.warning("[rank %s] writing context.json failed", rank, exc_info=True)
    return written


def _safe(fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001
        log.debug("context field failed", exc_info=True)
        return default
