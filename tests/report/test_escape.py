"""``report/escape.py``: which characters are made visible for a terminal (C0/C1 controls, DEL,
lone surrogates, bidirectional overrides) and how; which Markdown/HTML characters are
backslash-escaped; and ``escaped`` walking a whole Summary-like value, copying only what changed.

End-to-end escaping of hostile file names in the reports is in ``tests/analysis/test_hostile.py``."""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest

from lightning_ncclx.report.escape import escaped, markdown_safe, terminal_safe


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred", "\\x1b[31mred"),
        ("a\nb\tc\r", "a\\x0ab\\x09c\\x0d"),
        ("\x00\x7f", "\\x00\\x7f"),
        ("\x85\x9b", "\\x85\\x9b"),  # C1 controls (NEL, CSI)
        ("rank_1\udcff.pkl", "rank_1\\udcff.pkl"),  # an undecodable byte of a file name
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),  # right-to-left override
        ("\u2066isolate\u2069", "\\u2066isolate\\u2069"),
    ],
)
def test_terminal_safe_makes_controls_surrogates_and_bidi_overrides_visible(raw: str, shown: str) -> None:
    assert terminal_safe(raw) == shown


def test_terminal_safe_keeps_printable_text_and_other_scripts() -> None:
    text = "rank 3 on gpu-17 | café ✓ 日本 \u00a0 <tag> *x*"
    assert terminal_safe(text) == text


def test_markdown_safe_escapes_every_syntax_character() -> None:
    assert markdown_safe("\\`*_[]<>|#!~&") == "\\\\\\`\\*\\_\\[\\]\\<\\>\\|\\#\\!\\~\\&"
    assert markdown_safe("all_reduce (seq 3)") == "all\\_reduce (seq 3)"
    assert markdown_safe("<script>alert(1)</script>") == "\\<script\\>alert(1)\\</script\\>"


def test_markdown_safe_escapes_controls_first_so_their_backslash_survives_rendering() -> None:
    # "\x1b" becomes the four characters \x1b, whose backslash Markdown must not swallow
    assert markdown_safe("\x1b") == "\\\\x1b"


class Colour(str, Enum):
    RED = "\x1b[31m"


@dataclasses.dataclass(frozen=True)
class Inner:
    name: str
    ranks: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Outer:
    title: str
    inner: Inner
    items: list
    hosts: dict
    colour: Colour = Colour.RED
    count: int = 0
    ratio: float = 0.5
    flag: bool = True
    missing: str | None = None


def test_escaped_reaches_strings_nested_in_dataclasses_tuples_lists_and_mapping_keys() -> None:
    value = Outer(title="t\n", inner=Inner(name="a\x1bb", ranks=(1, 2)), items=["ok", ("x\ty",)],
                  hosts={0: "h\r", "k\x00": "v"})
    out = escaped(value, terminal_safe)
    assert out == Outer(title="t\\x0a", inner=Inner(name="a\\x1bb", ranks=(1, 2)), items=["ok", ("x\\x09y",)],
                        hosts={0: "h\\x0d", "k\\x00": "v"})
    assert type(out.items) is list and type(out.items[1]) is tuple
    assert out.colour is Colour.RED  # enums pass through unescaped: their value is the plugin's, not the dump's
    assert (out.count, out.ratio, out.flag, out.missing) == (0, 0.5, True, None)
    assert value.title == "t\n" and value.inner.name == "a\x1bb"  # the input is not modified


def test_escaped_copies_only_what_changed() -> None:
    clean_inner = Inner(name="fine", ranks=(0,))
    value = Outer(title="x\n", inner=clean_inner, items=["a"], hosts={0: "h"})
    out = escaped(value, terminal_safe)
    assert out is not value and out.title == "x\\x0a"
    assert out.inner is clean_inner and out.items is value.items and out.hosts is value.hosts


def test_escaped_returns_the_same_object_when_nothing_needs_escaping() -> None:
    value = Outer(title="plain", inner=Inner(name="n"), items=["a", ("b",)], hosts={1: "gpu-1"})
    assert escaped(value, terminal_safe) is value
    assert escaped(value, markdown_safe) is value
    underscored = dataclasses.replace(value, title="all_reduce")
    out = escaped(underscored, markdown_safe)
    assert out.title == "all\\_reduce" and out.hosts is value.hosts and out.items is value.items


def test_escaped_leaves_classes_and_unknown_objects_alone() -> None:
    marker = object()
    assert escaped(Inner, terminal_safe) is Inner  # a dataclass type, not an instance
    assert escaped(marker, terminal_safe) is marker
