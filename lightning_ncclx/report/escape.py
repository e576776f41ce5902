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
    return _UNSAFE.sub(_escape_char, text)


def markdown_safe(text: str) -> str:
    """:func:`terminal_safe`, and Markdown/HTML syntax characters backslash-escaped."""
    return _MARKDOWN.sub(r"\\\1", terminal_safe(text))


def escaped(value: Any, escape: Callable[[str], str]) -> Any:
    """A copy of ``value`` (dataclasses, tuples, lists, mappings, strings) with every string
    passed through ``escape``; enums and numbers unchanged."""
    if isinstance(value, Enum) or value is None or isinstance(value, (int, float, bool)):
        return value
    if isinstance(value, str):
        new = escape(value)
        return value if new == value else new
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = escaped(old, escape)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value  # unchanged: no copy
    if isinstance(value, (tuple, list)):
        items = [escaped(v, escape) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if hasattr(value, "_fields"):  # a named tuple keeps its type (a timeline op)
            return type(value)(*items)
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, Mapping):
        pairs = [(escaped(k, escape), escaped(v, escape)) for k, v in value.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())):
            return value
        return dict(pairs)
    return value
