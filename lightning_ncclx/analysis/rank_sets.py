"""How ``summary.json`` writes a set of ranks, and how every reader reads one back: the one place.

A summary of a job of at most :data:`LIST_MAX_RANKS` ranks writes each rank set as a JSON list
of ranks (``[0, 1, 3]``), as schema 1 did; a larger job writes every rank set of the file as a
string of ranges (``"0-4095,4097-16383"``): 16,384 ranks as a list are 104 KB, as ranges a few
bytes. A map from rank to a value (rank -> host, phase, step) is written grouped by value: the
value, then the set of ranks that share it (``{"node-a": "0-7"}``).

:func:`decode` reads both forms (and schema 1's lists), so a reader never needs to know which
one a file holds. It is strict: anything else raises :class:`ValueError`.

Example::

    encode([0, 1, 2, 5], ranges=True)    # '0-2,5'
    encode([0, 1, 2, 5], ranges=False)   # [0, 1, 2, 5]
    decode("0-2,5") == decode([0, 1, 2, 5]) == (0, 1, 2, 5)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

LIST_MAX_RANKS = 64
"""Jobs of up to this many ranks write rank sets as lists of ranks; larger ones as ranges."""
MAX_DECODED = 1 << 21
"""The most ranks :func:`decode` expands (a world above 2^20 ranks is not believed anyway): a
forged ``"0-99999999999"`` costs nothing."""
_RANGE = re.compile(r"(\d{1,9})(?:-(\d{1,9}))?", re.ASCII)


def uses_ranges(world_ranks: int) -> bool:
    """Whether a summary of ``world_ranks`` ranks (seen and missing) writes ranges."""
    return world_ranks > LIST_MAX_RANKS


def ranges_text(ranks: Iterable[int]) -> str:
    """``"0-4095,4097-16383"``: the ranks sorted, each run of consecutive ranks as ``first-last``."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def encode(ranks: Iterable[int], ranges: bool) -> list[int] | str:
    """A rank set as written: a list of ranks (in the order given) or a string of ranges."""
    return ranges_text(ranks) if ranges else list(ranks)


def decode(value: Any) -> tuple[int, ...]:
    """The ranks of a written rank set, in order (a list as written; ranges ascending).
    ValueError for anything that is neither a list of non-negative ints nor a string of ranges."""
    if isinstance(value, list):
        if not all(type(r) is int and r >= 0 for r in value):
            raise ValueError("a list of ranks holds something that is not a rank")
        return tuple(value)
    if not isinstance(value, str):
        raise ValueError(f"a rank set is a list or a string of ranges, not a {type(value).__name__}")
    out: list[int] = []
    for part in value.split(",") if value else ():
        match = _RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"not a range of ranks: {part[:40]!r}")
        a = int(match[1])
        b = int(match[2]) if match[2] is not None else a
        if b < a or (out and a <= out[-1]):
            raise ValueError(f"ranges out of order at {part[:40]!r}")
        if len(out) + b - a + 1 > MAX_DECODED:
            raise ValueError(f"more than {MAX_DECODED} ranks")
        out.extend(range(a, b + 1))
    return tuple(out)


def count(value: Any) -> int:
    """How many ranks a written rank set holds."""
    return len(decode(value))


def group(by_rank: Mapping[int, Any], ranges: bool) -> dict[str, list[int] | str]:
    """``{rank: value}`` grouped by value: ``{str(value): rank set}``, values in the order of
    their lowest rank."""
    ranks_of: dict[str, list[int]] = {}
    for rank in sorted(by_rank):
        ranks_of.setdefault(str(by_rank[rank]), []).append(rank)
    return {value: encode(ranks, ranges) for value, ranks in ranks_of.items()}


def ungroup(grouped: Any, name: str = "the map") -> dict[int, str]:
    """The inverse of :func:`group`: ``{rank: value}``. ValueError, naming ``name``, when
    ``grouped`` is not a map of text to rank sets."""
    if not isinstance(grouped, dict):
        raise ValueError(f"{name} is a {type(grouped).__name__}, not a map of values to rank sets")
    out: dict[int, str] = {}
    for value, ranks in grouped.items():
        try:
            out.update(dict.fromkeys(decode(ranks), value))
        except ValueError as error:
            raise ValueError(f"{name}.{value[:40]} is not a rank set: {error}") from None
    return out


def rank_map(document: Mapping[str, Any], grouped: str, by_rank: str) -> dict[int, str]:
    """A per-rank map of a summary document: schema 2's form grouped by value under ``grouped``
    (``host_ranks``), else schema 1's ``{rank: value}`` under ``by_rank`` (``hosts``), as it
    is on disk in older folders; {} when neither is there. ValueError when the one found is
    malformed (ranks that are not ranks, values that are not text)."""
    if document.get(grouped) is not None:
        return ungroup(document[grouped], grouped)
    old = document.get(by_rank)
    if old is None:
        return {}
    if not isinstance(old, dict):
        raise ValueError(f"{by_rank} is a {type(old).__name__}, not a map of ranks to values")
    out: dict[int, str] = {}
    for rank, value in old.items():
        if not (rank.isascii() and rank.isdigit() and len(rank) < 10):
            raise ValueError(f"{by_rank} has a key {rank[:20]!r} that is not a rank")
        if not isinstance(value, str):
            raise ValueError(f"{by_rank}.{rank} is {str(value)[:40]}, not text")
        out[int(rank)] = value
    return out
