"""Make text from dumps safe to print: file names and frames may hold newlines, ESC sequences,
lone surrogates (undecodable file names) or markup. Applied to a whole :class:`Summary` before a
text or Markdown report is rendered, so no field can be forgotten."""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from typing import Any, Callable, Mapping

# C0 and C1 controls, DEL, lone surrogates, and the bidirectional overrides that reorder text.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|#!~&])")


def _escape_char(m: re.Match) -> str:
    code = ord(m[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """Control characters, ESC and lone surrogates as visible ``\\xNN`` / ``\\uNNNN``."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape_char, text)


def markdown_safe(text: str) -> str:
    """:func:`terminal_safe`, and Markdown/HTML syntax characters backslash-escaped."""
    return _MARKDOWN.sub(r"\\\1", terminal_safe(text))


_ATOMS = frozenset({int, float, bool, type(None)})


def escaped(value: Any, escape: Callable[[str], str]) -> Any:
    """A copy of ``value`` (dataclasses, tuples, lists, mappings, strings) with every string
    passed through ``escape``; enums and numbers unchanged. What nothing changed in is returned
    as it is (a 16,384-rank summary is ~2 million values: each distinct string is escaped once)."""
    return _Escaper(escape).walk(value)


class _Escaper:
    def __init__(self, escape: Callable[[str], str]) -> None:
        self._escape = escape
        self._strings: dict[str, str] = {}
        """Each string met -> its escaped form, ``""`` where escaping changes nothing."""
        self._fields: dict[type, tuple[str, ...]] = {}

    def walk(self, value: Any) -> Any:
        kind = type(value)
        if kind is str:
            done = self._strings.get(value)
            if done is None:
                new = self._escape(value)
                done = self._strings[value] = "" if new == value else new
            return done or value  # "" stands for "unchanged": the very object comes back
        if kind in _ATOMS or isinstance(value, Enum):
            return value
        if isinstance(value, str):  # a str subclass
            new = self._escape(value)
            return value if new == value else new
        if isinstance(value, (tuple, list)):
            walk = self.walk
            items = [v if type(v) in _ATOMS else walk(v) for v in value]
            if all(a is b for a, b in zip(items, value)):
                return value
            if hasattr(value, "_fields"):  # a named tuple keeps its type (a timeline op)
                return type(value)(*items)
            return tuple(items) if isinstance(value, tuple) else items
        names = self._fields.get(kind)
        if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
            names = self._fields[kind] = tuple(f.name for f in dataclasses.fields(value))
        if names is not None:
            changes = {}
            for name in names:
                old = getattr(value, name)
                new = self.walk(old)
                if new is not old:
                    changes[name] = new
            return dataclasses.replace(value, **changes) if changes else value  # unchanged: no copy
        if isinstance(value, Mapping):
            pairs = [(self.walk(k), self.walk(v)) for k, v in value.items()]
            if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())):
                return value
            return dict(pairs)
        return value
