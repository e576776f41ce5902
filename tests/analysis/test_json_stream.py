"""json_stream: a large JSON dump read one entry at a time, the newest kept (``whole_bytes=0``
makes every document here large). Where nothing is dropped the result is ``json.loads``'s;
malformed JSON is a DumpReadError saying so."""

from __future__ import annotations

import codecs
import json

import pytest

from lightning_ncclx.analysis.json_stream import CHECK_EVERY, MIN_ENTRY_CHARS, decode
from lightning_ncclx.errors import DumpReadError

DOCS = [
    b'{"version": "2.10", "entries": [{"a": 1}, {"b": [1, 2, {"c": null}]}], "pg_config": {"0": {"ranks": "[0]"}}}',
    b' \n{ "entries" : [ ] ,"version":"2.10" } \n',
    b'{"version": "2.10"}',
    b'{}',
    b'{"entries": [1, "two", 3.5, true, false, null, [], {}], "x": "\\u00e9\\ud83d\\ude00\\n"}',
    b'{"entries": [{"a": 1}], "entries": [{"b": 2}, {"c": 3}]}',  # the last one wins, as in json.loads
    b'{"entries": {"not": "a list"}}',
    '{"entries": [{"name": "caf\u00e9"}]}'.encode(),
]


@pytest.mark.parametrize("raw", DOCS)
def test_what_it_keeps_whole_is_what_json_loads_gives(raw: bytes) -> None:
    data, total = decode([raw], 1000, whole_bytes=0)
    assert data == json.loads(raw)
    entries = json.loads(raw).get("entries")
    assert total == (len(entries) if isinstance(entries, list) else 0)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_the_encodings_json_loads_accepts_are_read(encoding: str) -> None:
    raw = '{"version": "2.10", "entries": [{"x": "\u00e9"}]}'.encode(encoding)
    assert decode([raw], 10, whole_bytes=0) == (json.loads(raw), 1)


def test_only_the_newest_entries_are_kept_and_all_are_counted() -> None:
    raw = json.dumps({"version": "2.10", "entries": [{"seq": i} for i in range(10)], "after": 1}).encode()
    data, total = decode([raw], 3, whole_bytes=0)
    assert data == {"version": "2.10", "entries": [{"seq": 7}, {"seq": 8}, {"seq": 9}], "after": 1} and total == 10


def test_the_buffer_is_taken_from_its_holder() -> None:
    held = [b'{"entries": []}']
    decode(held, 1)
    assert held == []


def test_a_top_level_array_is_not_walked() -> None:
    assert decode([b"[" + b"1," * 1000 + b"1]"], 5, whole_bytes=0) == ([], 0)


@pytest.mark.parametrize("raw", [
    b'{"entries": [{"a": 1}', b'{"entries": [{"a": 1} {"b": 2}]}', b'{"a": 1} x', b'{"a" 1}', b'{a: 1}',
    b'{"entries": [1,]}', b'{"a": 1,}', b"", b"{", b'{"a": [' + b"[" * 100_000 + b"]" * 100_001 + b"}",
    b'{"x": "\xff\xfe"}', codecs.BOM_UTF8 + b'{"a": nul}',
])
@pytest.mark.parametrize("whole_bytes", [0, 1 << 30], ids=["streamed", "whole"])
def test_malformed_json_is_refused_with_the_reason(raw: bytes, whole_bytes: int) -> None:
    with pytest.raises(DumpReadError, match="not valid JSON"):
        decode([raw], 10, whole_bytes)


def test_a_small_document_is_json_loads_whole_and_its_entries_counted() -> None:
    raw = json.dumps({"version": "2.10", "entries": [{"seq": i} for i in range(10)]}).encode()
    assert decode([raw], 3) == (json.loads(raw), 10)


def test_a_streamed_list_of_tiny_elements_is_refused_once_its_average_shows() -> None:
    # 10**6 numbers: walking them one by one would cost ~17x json.loads of the file
    raw = b'{"version": "2.10", "entries": [' + b"0," * 10**6 + b"0]}"
    with pytest.raises(DumpReadError, match=r"not a flight-recorder dump: its entries list holds 4,096 elements in "
                                            r"its first 8,192 characters \(2 each; torch writes about 500"):
        decode([raw], 1000, whole_bytes=0)


def test_elements_of_the_smallest_average_are_streamed() -> None:
    element = {"k": "x" * (MIN_ENTRY_CHARS - 11)}  # with ", " between: exactly the smallest average
    raw = json.dumps({"version": "2.10", "entries": [element] * 3 * CHECK_EVERY}).encode()
    assert len(json.dumps(element)) + 2 == MIN_ENTRY_CHARS
    data, total = decode([raw], 10, whole_bytes=0)
    assert total == 3 * CHECK_EVERY and data["entries"] == [element] * 10
