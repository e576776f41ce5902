"""A restricted unpickler for flight-recorder dumps, which are untrusted input.

Torch writes its dumps with plain ``pickle`` of builtin containers only (dict, list, tuple, str,
int, float, bool, None): no ``GLOBAL`` opcode ever appears (checked against the H200 fixtures and
torch 2.13/2.15 gloo dumps). So :class:`RestrictedUnpickler` refuses *every* global lookup: a
pickle that names any class or function (a malicious ``__reduce__`` does) fails with
:class:`~lightning_ncclx.errors.DumpReadError` before anything runs.
"""

from __future__ import annotations

import pickle
from typing import Any

from lightning_ncclx.errors import DumpReadError


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that loads builtin containers and scalars only.

    Example::

        data = RestrictedUnpickler(io.BytesIO(raw)).load()
    """

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see class docstring
        raise DumpReadError(
            f"refused to load {module}.{name}: flight-recorder dumps contain only builtin "
            "containers, so this pickle is not a dump (or was tampered with)"
        )

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise DumpReadError("refused a persistent id: flight-recorder dumps never use them")


class _AllAtOnce:
    """What :func:`safe_loads` gives the unpickler to read from: its first read hands over the
    whole pickle, whatever size it asked for, and any later read nothing (a truncated pickle).
    CPython's C unpickler keeps what it did not need yet as its input buffer and reads on from
    there without a copy, as ``pickle.loads`` does; through ``io.BytesIO`` every frame was copied
    (one more pass over each dump's bytes: a few percent of reading 16,384 dumps).
    ``tests/analysis/test_safe_pickle.py`` checks the result equals ``pickle.loads``'s."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def read(self, size: int = -1) -> bytes:  # noqa: ARG002 - all of it, see the class
        raw, self._raw = self._raw, b""
        return raw

    readline = read


def safe_loads(raw: bytes) -> Any:
    """Unpickle ``raw`` with :class:`RestrictedUnpickler`; any failure is a DumpReadError."""
    try:
        return RestrictedUnpickler(_AllAtOnce(raw)).load()
    except DumpReadError:
        raise
    except (pickle.UnpicklingError, EOFError) as exc:
        raise DumpReadError(f"not a valid pickle ({exc or 'truncated'})") from None
    except MemoryError:
        raise DumpReadError("not a valid pickle, or too large: it needs more than the memory cap to load (hostile, "
                            "corrupt, or a dump too large to decode whole)") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
            RecursionError, UnicodeDecodeError) as exc:
        raise DumpReadError(f"not a valid pickle ({type(exc).__name__}: {exc})") from None
