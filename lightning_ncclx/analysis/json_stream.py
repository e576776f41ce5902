"""A large JSON dump read one entry at a time, keeping only the newest entries.

``json.loads`` of a 200 MB dump holds every entry at once (over 2 GiB); here the top-level object
is walked key by key and each element of its ``entries`` list is decoded by the C scanner and
dropped once :data:`parse.MAX_ENTRIES` newer ones follow. Other keys (``pg_config``...) decode
whole. Same result as ``json.loads`` where nothing is dropped; malformed JSON is a DumpReadError.

Walking the list costs a few hundred nanoseconds of Python per element on top of the C scanner,
which is what keeps the reading at ``json.loads``'s rate for torch's entries (500 bytes each) but
would make a list of tiny elements (10**8 numbers in 200 MB) cost 17x ``json.loads``: a list
whose elements average under :data:`MIN_ENTRY_CHARS` is refused as soon as that shows.
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
MIN_ENTRY_CHARS = 256
"""Fewest bytes per element, on average, of a streamed entries list: a torch entry in JSON is
about 500 (its 20 keys' names alone take ~320; the smallest of the H200's dumps is 524)."""
CHECK_EVERY = 4096
"""Elements between two looks at the average."""
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
    text, start, space, scan = doc.text, doc.at, _SPACE.match, _SCANNER.scan_once
    kept: deque = deque(maxlen=keep)
    append = kept.append
    total = 0
    at = space(text, start).end()
    if text[at:at + 1] == "]":
        doc.at = at + 1
        return [], 0
    while True:  # one element per turn, the fewest Python steps: this loop is the streamed reading's cost
        try:
            value, at = scan(text, at)
        except StopIteration as stop:
            raise ValueError(f"expecting a value at char {stop.value}") from None
        append(value)
        total += 1
        at = space(text, at).end()
        char = text[at:at + 1]
        if char == ",":
            at = space(text, at + 1).end()
            if not total % CHECK_EVERY and at - start < MIN_ENTRY_CHARS * total:
                raise DumpReadError(_tiny_entries(total, at - start))
            continue
        if char != "]":
            raise ValueError(f"expecting ',' or ']' at char {at}")
        doc.at = at + 1
        return list(kept), total


def _tiny_entries(count: int, chars: int) -> str:
    return (f"not a flight-recorder dump: its entries list holds {count:,} elements in its first {chars:,} "
            f"characters ({chars / count:.0f} each; torch writes about 500 per entry, never under "
            f"{MIN_ENTRY_CHARS}), a shape that would take far longer to read than the file's size warrants")
