"""What one Trainer's run leaves in the process, and how it is taken back at teardown.

A strategy exports the flight-recorder variables and creates the dump folders on every rank
before the process group exists; :class:`RunScope` remembers what was there before, so that
teardown puts the environment back and removes the folders it made that stayed empty. A second
Trainer in the same process therefore starts from a clean slate, with a run id of its own.
"""

from __future__ import annotations

import os
import secrets
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from lightning_ncclx.layout import run_id_from_environment
from lightning_ncclx.errors import ConfigError

# The process's base run id (set by the first Trainer that needs one) and how many Trainers have
# taken an id from it. Every rank builds the same Trainers in the same order, so the n-th Trainer
# of each rank gets the same id: the launcher's for the first, "<id>-<n>" for the later ones.
_base_run_id: str | None = None
_trainers_in_process = 0


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def next_trainer() -> tuple[str, int]:
    """The run id and number (1, 2, ...) of the next Trainer in this process, the same on every
    rank of the job."""
    global _base_run_id, _trainers_in_process
    base = run_id_from_environment() or _base_run_id or new_run_id()
    if base != _base_run_id:
        _base_run_id, _trainers_in_process = base, 0
    _trainers_in_process += 1
    number = _trainers_in_process
    return (base if number == 1 else f"{base}-{number}"), number


def next_run_id() -> str:
    """The run id of the next Trainer in this process (see :func:`next_trainer`)."""
    return next_trainer()[0]


@contextmanager
def exported(variables: Mapping[str, str]) -> Iterator[None]:
    """Set ``variables`` for the duration of the block only (e.g. while child processes start)."""
    scope = RunScope()
    scope.export(variables)
    try:
        yield
    finally:
        scope.close()


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing: list[Path] = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


class RunScope:
    """Variables set and folders created for one run, undone by :meth:`close` (picklable)."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}
        self._created: list[Path] = []

    def export(self, variables: Mapping[str, str]) -> None:
        """Set each variable, remembering the value it had before this scope first set it."""
        for name, value in variables.items():
            if name not in self._saved:
                self._saved[name] = os.environ.get(name)
            os.environ[name] = value

    def make_writable_folder(self, folder: Path, key: str) -> None:
        """Create ``folder`` (remembering which folders were new) and prove a file can be written
        there, or raise ConfigError naming ``key``."""
        new = missing_folders(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise ConfigError(f"{key}: the dump folder {str(folder)!r} is not writable ({err.strerror or err})") from None
        finally:
            self._created.extend(path for path in new if path not in self._created)

    def remove_when_empty(self, folders: Iterable[Path]) -> None:
        """Also try these folders at :meth:`close` (made by another rank of the run, perhaps)."""
        self._created.extend(path for path in folders if path not in self._created)

    def close(self) -> None:
        """Restore every variable and remove the created folders that are still empty."""
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()
        for folder in sorted(self._created, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()  # only ever an empty folder: a dump written there keeps it
            except OSError:
                pass
        self._created.clear()
