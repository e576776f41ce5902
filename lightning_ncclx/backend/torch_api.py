"""Every call into torch's private distributed API, in one module.

torch keeps its flight recorder's dump functions, its table of live process groups, the default
store and its backend classes private (``torch._C._distributed_c10d``, underscored names of
``torch.distributed.distributed_c10d``, ``ProcessGroup._get_backend``). They change between
releases (``"nccl"`` now builds ProcessGroupNCCL2; recording moves into per-backend hooks), so
the rest of the package reaches them only through the functions here, and
``tests/test_torch_private_api.py`` fails on a direct call anywhere else (its temporary
allowlist names the modules still to move).

Each function names the torch versions it was checked on and what it does where torch lacks the
call: 2.15.0 (the version the tests run on; its ``distributed_c10d.py`` and
``_C/_distributed_c10d.pyi`` read) and 2.13.0 (the CPU wheel: ``tests/backend/test_torch_api.py``
and the tests of the modules that call these pass on it).
torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

_FALLBACK_DEVICE_TYPES = ("cpu", "cuda")


def _bindings() -> ModuleType | None:
    """``torch._C._distributed_c10d``, or None in a torch built without distributed support."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return None
    return torch._C._distributed_c10d


def _c10d() -> ModuleType:
    from torch.distributed import distributed_c10d

    return distributed_c10d


# --- what the installed torch offers -------------------------------------------------------------


def has_nccl2() -> bool:
    """Whether torch has the rewritten NCCL backend class ``ProcessGroupNCCL2`` (and with it the
    backend names "nccl2", "nccl-lazy" and "nccl-legacy").

    Checked on: 2.15.0 (present, also in CPU-only processes of a CUDA build); 2.13.0 (absent:
    False). False in a torch without distributed support."""
    bindings = _bindings()
    return bindings is not None and hasattr(bindings, "ProcessGroupNCCL2")


def nccl_version() -> str | None:
    """The NCCL version torch links, dotted (``"2.28.9"``), or None when torch has no NCCL or the
    library cannot be loaded (a CPU-only machine may fail to load ``libnccl``).

    Checked on: 2.15.0 (``torch.cuda.nccl.version()`` gives a tuple); older torch gave one
    integer, returned as is (``"21805"``); 2.13.0 CPU wheel: no NCCL, None."""
    try:
        import torch

        if not torch.distributed.is_nccl_available():
            return None
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU-only machine may fail to load libnccl: no version, not an error
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


# --- the live process groups ---------------------------------------------------------------------


def default_group() -> Any:
    """The default (world) process group, or None before ``init_process_group``.

    Checked on: 2.13.0 and 2.15.0 (``distributed_c10d._get_default_group``, which raises
    ValueError when no group exists: None here instead)."""
    c10d = _c10d()
    if not c10d.is_initialized():
        return None
    return c10d._get_default_group()


def default_store() -> Any:
    """The store the default process group was created with (the job's TCPStore under torchrun
    and Lightning's launchers, wrapped in torch's own ``PrefixStore``).

    Checked on: 2.13.0 and 2.15.0 (``distributed_c10d._get_default_store``). Raises ValueError
    before ``init_process_group``, as torch does: a caller that needs the store has nothing to
    fall back to."""
    return _c10d()._get_default_store()


def member_groups() -> list[Any]:
    """Every live process group this rank belongs to, the world group first; empty before
    ``init_process_group``.

    Checked on: 2.13.0 and 2.15.0 (``distributed_c10d._world.pg_map`` holds every group created
    in this process; ``_rank_not_in_group`` tells a non-member's placeholder apart; a key
    without ``_get_backend`` is no process group and is skipped)."""
    c10d = _c10d()
    if not c10d.is_initialized():
        return []
    world = c10d._get_default_group()
    groups = [world]
    for group in list(c10d._world.pg_map):
        if group is world or not hasattr(group, "_get_backend") or c10d._rank_not_in_group(group):
            continue
        groups.append(group)
    return groups


@dataclass(frozen=True)
class GroupMembers:
    """One process group as torch's table of groups knows it."""

    name: str
    """The group's name (``"0"`` for the world group), as flight-recorder entries cite it."""
    desc: str
    """Its description (``"default_pg"``, ``group_desc=`` of ``new_group``; ``"undefined"``
    where torch has none)."""
    ranks: tuple[int, ...]
    """Global ranks of its members, sorted."""


def group_members() -> list[GroupMembers]:
    """Name, description and member ranks of every group this rank belongs to; empty before
    ``init_process_group``. Gloo's own recorder writes a broken ``pg_config`` (one ``""`` key,
    overwritten by each new group): this is what replaces it.

    Checked on: 2.13.0 and 2.15.0 (``_world.pg_group_ranks`` maps each group, non-member
    placeholders included, to ``{global rank: group rank}``; ``_world.pg_names``; the group's
    ``group_desc``, ``"undefined"`` when reading it fails)."""
    c10d = _c10d()
    if not c10d.is_initialized():
        return []
    world = c10d._world
    found: list[GroupMembers] = []
    for group, ranks in list(world.pg_group_ranks.items()):
        if not hasattr(group, "_get_backend"):
            continue  # a non-member placeholder
        try:
            desc = str(group.group_desc)
        except Exception:  # noqa: BLE001 - a group without a description
            desc = "undefined"
        found.append(GroupMembers(str(world.pg_names.get(group, "")), desc, tuple(sorted(int(r) for r in ranks))))
    return found


def group_backends(group: Any) -> list[tuple[Any, Any]]:
    """``(torch.device, backend object)`` for each device type ``group`` has a backend for: the
    implementation that actually serves it (``ProcessGroupNCCL2`` where ``dist.get_backend``
    still says ``"nccl"``). Devices the group has no backend for are left out.

    Checked on: 2.13.0 and 2.15.0 (``ProcessGroup._device_types`` and ``_get_backend(device)``,
    which raises RuntimeError for a device without a backend). A torch without
    ``_device_types`` is asked for cpu and cuda."""
    import torch

    try:
        device_types = list(group._device_types)
    except AttributeError:
        device_types = list(_FALLBACK_DEVICE_TYPES)
    found: list[tuple[Any, Any]] = []
    for device_type in device_types:
        device = torch.device(device_type) if isinstance(device_type, str) else device_type
        try:
            found.append((device, group._get_backend(device)))
        except Exception:  # noqa: BLE001 - no backend for this device (RuntimeError in 2.13 and 2.15)
            continue
    return found


def backend_timeout_seconds(backend: Any) -> float | None:
    """The default collective timeout a backend object currently applies, in seconds, or None
    where it does not say.

    Checked on: 2.13.0 and 2.15.0 for gloo (``backend.options._timeout``, a timedelta: a field
    of ``Backend.Options``, which every backend's options extend in the 2.15.0 stubs)."""
    try:
        return float(backend.options._timeout.total_seconds())
    except (AttributeError, RuntimeError):
        return None


def set_group_timeout(timeout: timedelta, group: Any) -> None:
    """Set the default timeout of every backend of ``group`` for the operations that follow.

    Checked on: 2.15.0 (the public ``torch.distributed.set_timeout``); 2.13.0 has none, and
    ``distributed_c10d._set_pg_timeout`` (the same call, deprecated in 2.15) is used there.
    Raises what torch raises for a backend that cannot change its timeout."""
    import torch.distributed as dist

    setter = getattr(dist, "set_timeout", None)
    if setter is None:
        setter = _c10d()._set_pg_timeout
    setter(timeout, group)


def live_groups() -> list[Any]:
    """Every process group of this process, the placeholders of groups it is no member of
    included (what torch's table holds), cheap enough to call per batch; empty before
    ``init_process_group``.

    Checked on: 2.13.0 and 2.15.0 (``distributed_c10d._world.pg_map``)."""
    c10d = _c10d()
    return list(c10d._world.pg_map) if c10d.is_initialized() else []


def group_name(group: Any) -> str:
    """The name flight-recorder entries cite for ``group`` (``"0"`` for the world group).

    Checked on: 2.13.0 and 2.15.0 (``distributed_c10d._get_process_group_name``)."""
    return str(_c10d()._get_process_group_name(group))


def global_ranks_of(group: Any) -> dict[int, int]:
    """``{group rank: global rank}`` of ``group``; empty for a group this rank is no member of.

    Checked on: 2.13.0 and 2.15.0 (``_world.pg_group_ranks[group]`` maps global to group rank)."""
    ranks = _c10d()._world.pg_group_ranks.get(group) or {}
    return {int(group_rank): int(global_rank) for global_rank, group_rank in ranks.items()}


def served_by(group: Any, backend_name: str) -> bool:
    """True when one of ``group``'s backends is ``backend_name`` (lower case, e.g. ``"gloo"``).

    Checked on: 2.13.0 and 2.15.0 (through :func:`group_backends`; ``Backend.name()``)."""
    return any(str(backend.name()).lower() == backend_name for _, backend in group_backends(group))


def process_group_hook_op_names() -> Any | None:
    """torch's ``HookOpName`` enum (``SEND``, ``RECV``, ...) for ``ProcessGroup.register_pre_hook``
    and ``register_post_hook``; None where torch has no process-group hooks.

    Checked on: 2.15.0 (``torch._C._distributed_c10d.HookOpName``); absent in 2.13.0."""
    bindings = _bindings()
    return getattr(bindings, "HookOpName", None) if bindings is not None else None


# --- the flight recorder ------------------------------------------------------------------------


def dump_fr_trace(include_collectives: bool, include_stack_traces: bool, only_active: bool, backend: str) -> bytes:
    """The pickled flight-recorder trace of the recorder kept under ``backend`` (``"gloo"``,
    ``"nccl2"``, ``"nccl-lazy"``, ``"xccl"``): every backend that records by itself or through
    torch's hook has its own ring buffer, and a name without one gives an empty, valid dump.

    Checked on: 2.15.0 (``_dump_fr_trace(..., backend=)``); 2.13.0 keeps one recorder for every
    self-recording backend and its ``_dump_fr_trace`` takes no ``backend`` (TypeError): that
    one recorder is dumped."""
    bindings = _require_bindings()
    try:
        return bindings._dump_fr_trace(include_collectives, include_stack_traces, only_active, backend=backend)
    except TypeError:
        return bindings._dump_fr_trace(include_collectives, include_stack_traces, only_active)


def dump_nccl_trace(include_collectives: bool, include_stack_traces: bool, only_active: bool) -> bytes:
    """The pickled trace of the legacy ProcessGroupNCCL's own recorder (adds ``nccl_comm_state``).

    Checked on: 2.15.0 (``_dump_nccl_trace``, present in CUDA builds even without a GPU);
    2.13.0 has it only in CUDA builds: AttributeError in a CPU-only wheel, where no legacy NCCL
    group can exist to be dumped."""
    return _require_bindings()._dump_nccl_trace(include_collectives, include_stack_traces, only_active)


def dump_fr_trace_json(include_entries: bool, only_active: bool, backend: str) -> bytes:
    """The JSON flight-recorder trace of the recorder kept under ``backend`` (never frames;
    ``pg_status`` holds each group's last enqueued, started and completed op), as bytes.

    Checked on: 2.15.0 (``_dump_fr_trace_json(..., backend=)``); 2.13.0 without ``backend``
    (TypeError): its one recorder is dumped."""
    bindings = _require_bindings()
    try:
        return bindings._dump_fr_trace_json(include_entries, only_active, backend=backend)
    except TypeError:
        return bindings._dump_fr_trace_json(include_entries, only_active)


def dump_nccl_trace_json(include_entries: bool, only_active: bool) -> bytes:
    """The JSON trace of the legacy ProcessGroupNCCL's recorder, as bytes.

    Checked on: 2.15.0 (``_dump_nccl_trace_json``); 2.13.0 only in CUDA builds
    (AttributeError otherwise, as for :func:`dump_nccl_trace`)."""
    return _require_bindings()._dump_nccl_trace_json(include_entries, only_active)


def _require_bindings() -> ModuleType:
    bindings = _bindings()
    if bindings is None:
        raise RuntimeError("this torch was built without torch.distributed: it has no flight recorder")
    return bindings
