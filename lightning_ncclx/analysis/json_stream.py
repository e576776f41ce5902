"""A large JSON dump read one entry at a time, keeping only the newest entries.

``json.loads`` of a 200 MB dump holds every entry at once (over 2 GiB); here the top-level object
is walked key by key and each element of its ``entries`` list is decoded by the C scanner and
dropped once :data:`parse.MAX_ENTRIES` newer ones follow. Other keys (``pg_config``...) decode
whole. Same result as ``json.loads`` where nothing is dropped; malformed JSON is a DumpReadError.
"""

from __future__ import annotations

import json
import re
from collections import deque
from json.decoder import scanstring
from typing import Any

from lightning_ncclx.errors import DumpReadError

WHOLE_BYTES = 16 << 20
"""A JSON dump up to this size is decoded whole by ``json.loads`` (twice as fast, and bounded by
its size: torch's 20,000-entry buffer writes ~10 MB); a larger one one entry at a time."""
_SPACE = re.compile(r"[ \t\n\r]*")
_SCANNER = json.JSONDecoder()


class _Text:
    """A cursor over the document."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def skip(self) -> str:
        """Past whitespace; the next character ('' at the end)."""
        self.at = _SPACE.match(self.text, self.at).end()
        return self.text[self.at:self.at + 1]

    def expect(self, char: str) -> None:
        if self.skip() != char:
            raise ValueError(f"expecting {char!r} at char {self.at}")
        self.at += 1

    def value(self) -> Any:
        try:
            value, self.at = _SCANNER.scan_once(self.text, self.at)
        except StopIteration as stop:
            raise ValueError(f"expecting a value at char {stop.value}") from None
        return value


def decode(held: list[bytes], keep: int, whole_bytes: int = WHOLE_BYTES) -> tuple[Any, int]:
    """The document in the one buffer ``held`` holds (taken out of it: once decoded to text, the
    bytes are freed), and how many entries its top-level ``entries`` list held. Up to
    ``whole_bytes`` it is ``json.loads``'s (every entry; the caller keeps the newest); beyond,
    only the newest ``keep`` entries are in it, and a top-level array is not walked (no dump is
    one): an empty list stands for it."""
    raw = held.pop()
    if len(raw) <= whole_bytes:
        return _whole(raw)
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    except (UnicodeDecodeError, LookupError) as exc:
        raise DumpReadError(f"not valid JSON ({str(exc)[:80]})") from None
    del raw
    try:
        return _document(_Text(text.removeprefix("\ufeff")), keep)
    except (ValueError, RecursionError, IndexError) as exc:
        raise DumpReadError(f"not valid JSON ({str(exc)[:80]})") from None


def _whole(raw: bytes) -> tuple[Any, int]:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise DumpReadError(f"not valid JSON ({str(exc)[:80]})") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    return data, len(entries) if isinstance(entries, list) else 0


def _document(doc: _Text, keep: int) -> tuple[Any, int]:
    first = doc.skip()
    if first == "[":
        return [], 0
    doc.expect("{")
    out: dict[str, Any] = {}
    total = 0
    if doc.skip() == "}":
        doc.at += 1
    else:
        while True:
            if doc.skip() != '"':
                raise ValueError(f"expecting a property name at char {doc.at}")
            key, doc.at = scanstring(doc.text, doc.at + 1)
            doc.expect(":")
            if key == "entries" and doc.skip() == "[":
                out[key], total = _entries(doc, keep)
            else:
                doc.skip()
                out[key] = doc.value()
            if doc.skip() == ",":
                doc.at += 1
                continue
            doc.expect("}")
            break
    if doc.skip():
        raise ValueError(f"extra data at char {doc.at}")
    return out, total


def _entries(doc: _Text, keep: int) -> tuple[list, int]:
    doc.expect("[")
    kept: deque = deque(maxlen=keep)
    total = 0
    if doc.skip() == "]":
        doc.at += 1
        return [], 0
    while True:
        doc.skip()
        kept.append(doc.value())
        total += 1
        if doc.skip() == ",":
            doc.at += 1
            continue
        doc.expect("]")
        return list(kept), total
