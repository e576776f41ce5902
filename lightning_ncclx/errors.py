"""One exception family. Messages name the dotted config key or the file, and the bad value."""

from __future__ import annotations


class NcclxError(Exception):
    """Base of every error lightning-ncclx raises on purpose."""


class ConfigError(NcclxError, ValueError):
    """A configuration value is invalid; the message names the key (``ncclx.watchdog.exit_code``)."""


class BackendUnavailableError(NcclxError, RuntimeError):
    """The backend asked for cannot be served by the installed torch or by this machine."""


class DumpReadError(NcclxError):
    """A dump file could not be read (corrupt, truncated, wrong type, or not a flight-recorder dump)."""
