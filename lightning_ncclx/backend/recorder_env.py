"""Build and apply the flight-recorder environment variables torch reads.

Pure building (:func:`build_recorder_env`) is separate from applying (:func:`apply_recorder_env`)
so the doctor and the tests can see what would be exported. torch reads these variables once,
when the first recorder is created: they must be applied before the process group exists.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, MutableMapping

from lightning_ncclx.config import MAX_BUFFER_SIZE, EnvPrecedence, FlightRecorderConfig
from lightning_ncclx.errors import ConfigError

log = logging.getLogger(__name__)

# Primary name first, then the older names torch still reads. torch takes the first one that is
# set, so exporting the primary name wins over any alias the user left in the environment.
VARIABLE_ALIASES: dict[str, tuple[str, ...]] = {
    "TORCH_FR_BUFFER_SIZE": ("TORCH_NCCL_TRACE_BUFFER_SIZE",),
    "TORCH_FR_DUMP_ON_TIMEOUT": ("TORCH_NCCL_DUMP_ON_TIMEOUT",),
    "TORCH_FR_DUMP_TEMP_FILE": ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",),
    "TORCH_FR_CPP_STACK": ("TORCH_NCCL_TRACE_CPP_STACK",),
    "TORCH_NCCL_ENABLE_TIMING": (),
}
# torch before 2.15 may read only the older TORCH_NCCL_* names of these in its NCCL code: there
# they are exported too, with the same value. torch 2.15 warns about the old names, so it gets
# the primary names alone. The buffer size and the C++ stacks are read by the flight recorder
# itself through one list of names, the new one first (getCvarInt/getCvarBool({"TORCH_FR_...",
# "TORCH_NCCL_TRACE_..."})), which warns on every rank whenever the old name is set at all: those
# two get the new name alone on every torch (2.11 on an H200 named TORCH_FR_CPP_STACK in that warning).
ALSO_EXPORT_LEGACY = ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")


def torch_reads_legacy_names(torch_version: str) -> bool:
    """Whether the older TORCH_NCCL_* aliases must be exported too for ``torch_version``."""
    parts = torch_version.split("+")[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return True
    return (major, minor) < (2, 15)

_ASCII_INTEGER = re.compile(r"-?[0-9]+")
"""What C++'s std::stoi and Python's int() both read as the same integer (str.isdigit also takes '²')."""
_BOOLEAN_VARIABLES = {"TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_FR_CPP_STACK", "TORCH_NCCL_ENABLE_TIMING"}
_CONFIG_KEYS = {
    "TORCH_FR_BUFFER_SIZE": "ncclx.flight_recorder.buffer_size",
    "TORCH_FR_DUMP_ON_TIMEOUT": "ncclx.flight_recorder.dump_on_timeout",
    "TORCH_FR_DUMP_TEMP_FILE": "ncclx.flight_recorder.dump_dir",
    "TORCH_FR_CPP_STACK": "ncclx.flight_recorder.cpp_stacks",
    "TORCH_NCCL_ENABLE_TIMING": "ncclx.flight_recorder.timing",
}


@dataclass(frozen=True)
class EnvConflict:
    """A variable the user already set to something other than what the config asks for."""

    variable: str
    user_value: str
    config_value: str
    config_key: str
    winner: EnvPrecedence

    def message(self) -> str:
        kept = self.config_value if self.winner is EnvPrecedence.config else self.user_value
        return (
            f"{self.variable}={self.user_value!r} from the environment disagrees with {self.config_key} "
            f"(-> {self.config_value!r}); using {kept!r} "
            f"(ncclx.flight_recorder.env_precedence={self.winner.value})"
        )


def _bool(value: bool) -> str:
    return "1" if value else "0"


def build_recorder_env(config: FlightRecorderConfig, torch_dump_prefix: Path) -> dict[str, str]:
    """The variables (primary names only) that express ``config``; never an empty value."""
    return {
        "TORCH_FR_BUFFER_SIZE": str(int(config.buffer_size)),
        "TORCH_FR_DUMP_ON_TIMEOUT": _bool(config.dump_on_timeout),
        "TORCH_FR_DUMP_TEMP_FILE": str(torch_dump_prefix),
        "TORCH_FR_CPP_STACK": _bool(config.cpp_stacks),
        "TORCH_NCCL_ENABLE_TIMING": _bool(config.timing),
    }


def malformed_reason(variable: str, value: str) -> str | None:
    """Why ``value`` would break torch (hang, crash or raise), or None when it is well-formed."""
    if variable in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if not _ASCII_INTEGER.fullmatch(value):
            return "not an integer (an empty or malformed size makes gloo group creation hang)"
        if int(value) < 0:
            return "negative (Python treats it as off, C++ as on)"
        if int(value) > MAX_BUFFER_SIZE:
            return (f"over {MAX_BUFFER_SIZE}, the largest size torch reads (a C int: a larger one hangs group "
                    "creation or aborts the process)")
        return None
    canonical = next((k for k, aliases in VARIABLE_ALIASES.items() if variable == k or variable in aliases), variable)
    if canonical in _BOOLEAN_VARIABLES and value.strip().lower() not in ("0", "1", "true", "false", "yes", "no", "y", "n"):
        return "not a boolean 0/1 (an empty TORCH_FR_CPP_STACK kills the process)"
    if canonical == "TORCH_FR_DUMP_TEMP_FILE" and not value.strip():
        return "empty"
    return None


def user_value(variable: str, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(name, value) of the first of ``variable`` and its aliases set in ``environ``: what torch reads."""
    for name in (variable, *VARIABLE_ALIASES.get(variable, ())):
        if name in environ:
            return name, environ[name]
    return None


def resolve_recorder_env(
    wanted: Mapping[str, str],
    precedence: EnvPrecedence,
    environ: Mapping[str, str],
    *,
    export_legacy_names: bool = False,
) -> tuple[dict[str, str], list[EnvConflict]]:
    """Decide what to export given what the user already set.

    Returns the variables to set (legacy aliases included) and the conflicts to report.
    Raises ConfigError when the user's value would win and is malformed.
    """
    to_set: dict[str, str] = {}
    conflicts: list[EnvConflict] = []
    for variable, value in wanted.items():
        existing = user_value(variable, environ)
        if existing is not None and existing[1] != value:
            name, current = existing
            conflicts.append(EnvConflict(name, current, value, _CONFIG_KEYS[variable], precedence))
            if precedence is EnvPrecedence.environment:
                reason = malformed_reason(name, current)
                if reason:
                    raise ConfigError(
                        f"{name}={current!r} is set in the environment and "
                        f"ncclx.flight_recorder.env_precedence=environment keeps it, but it is {reason}; "
                        f"unset it or use env_precedence=config"
                    )
                continue
        to_set[variable] = value
        if export_legacy_names and variable in ALSO_EXPORT_LEGACY:
            for alias in VARIABLE_ALIASES[variable]:
                to_set[alias] = value
    return to_set, conflicts


def apply_recorder_env(
    config: FlightRecorderConfig,
    torch_dump_prefix: Path,
    environ: MutableMapping[str, str] | None = None,
    *,
    torch_version: str | None = None,
) -> tuple[dict[str, str], list[EnvConflict]]:
    """Export the recorder variables into ``environ`` (default ``os.environ``); returns what was set
    and the conflicts found (each is also logged as a warning)."""
    env = os.environ if environ is None else environ
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    wanted = build_recorder_env(config, torch_dump_prefix)
    to_set, conflicts = resolve_recorder_env(
        wanted, config.env_precedence, env, export_legacy_names=torch_reads_legacy_names(torch_version)
    )
    for conflict in conflicts:
        log.warning(conflict.message())
    env.update(to_set)
    return to_set, conflicts


def recorder_variables_in_effect(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every TORCH_FR_* / recorder-related TORCH_NCCL_* variable currently set."""
    env = os.environ if environ is None else environ
    names = set(VARIABLE_ALIASES) | {a for aliases in VARIABLE_ALIASES.values() for a in aliases}
    names |= {"TORCH_DIST_USE_NCCL2", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT"}
    return {k: v for k, v in sorted(env.items()) if k in names or k.startswith("TORCH_FR_")}


def malformed_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Recorder variables whose current value would hang, crash or mislead torch: name -> why."""
    found: dict[str, str] = {}
    for name, value in recorder_variables_in_effect(environ).items():
        if name == "TORCH_DIST_USE_NCCL2":
            continue
        reason = malformed_reason(name, value)
        if reason:
            found[name] = reason
    return found
