"""A digest is read from the job's store: anything that is not what this version writes is
refused with a reason (DigestError), never a crash, a hang, a file outside the rank's names or a
rank the job does not have."""

from __future__ import annotations

import json
import pickle
import random
import re
from pathlib import Path

import pytest

from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.dump.digest import make_digest
from lightning_ncclx.dump.digest_expand import MAX_DIGEST_JSON, DigestError, expand_digest

WORLD = 8


def _valid(tmp_path: Path) -> dict:
    entries = [{"record_id": i, "process_group": ("0", "default_pg"), "collective_seq_id": i + 1, "p2p_seq_id": 0,
                "profiling_name": "gloo:all_reduce", "time_created_ns": 10**18 + i * 10**6, "input_sizes": [[4]],
                "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "scheduled",
                "retired": i < 5, "is_p2p": False,
                "frames": [{"name": "step", "filename": "/home/u/train.py", "line": 7}]} for i in range(6)]
    entries.append(dict(entries[0], process_group=("1", "tp"), is_p2p=True, profiling_name="gloo:send"))
    trace = tmp_path / "rank_00003.gloo.fr.pkl"
    trace.write_bytes(pickle.dumps({"version": "2.10", "entries": entries,
                                    "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}}))
    ctx = tmp_path / "rank_00003.context.json"
    ctx.write_text(json.dumps({"rank": 3, "host": "node-0", "phase": "train_step"}))
    stacks = tmp_path / "rank_00003.stacks.txt"
    stacks.write_text("--- thread 'MainThread' (id 1) ---\n  File \"/home/u/train.py\", line 7, in step\n")
    return json.loads(make_digest([trace, ctx, stacks]))


def _expand(doc: object, rank: int = 3) -> dict[str, bytes]:
    return expand_digest(json.dumps(doc).encode(), rank, WORLD)


def test_a_valid_digest_expands_into_the_ranks_own_file_names(tmp_path):
    assert sorted(_expand(_valid(tmp_path), rank=5)) == ["rank_00005.context.json", "rank_00005.gloo.fr.pkl",
                                                          "rank_00005.stacks.txt"]


def _trace(doc: dict) -> dict:
    return doc["traces"][0]


CASES = {
    "not JSON": lambda d: b"{not json",
    "a list": lambda d: [],
    "another schema": lambda d: dict(d, schema="lightning-ncclx/digest/1"),
    "a tag that is a path": lambda d: _set(d, "tag", "../../etc"),
    "a run past the job": lambda d: _set(d, "pg_config", [["0", "default_pg", [[0, 9, 1]]]]),
    "more members than ranks": lambda d: _set(d, "pg_config", [["0", "default_pg", [[0, 8, 1], [0, 8, 1]]]]),
    "a zero step": lambda d: _set(d, "pg_config", [["0", "default_pg", [[0, 2, 0]]]]),
    "too many runs": lambda d: _set(d, "pg_config", [["0", "x", [[0, 1, 1]] * 65]]),
    "a group index out of range": lambda d: _lane(d, 0, 7),
    "a signature index out of range": lambda d: _lane(d, 4, [0, 0, 0, 0, 99]),
    "columns of different lengths": lambda d: _lane(d, 6, [1] * 7),
    "a bool where an int belongs": lambda d: _lane(d, 1, True),
    "a sequence id below zero": lambda d: _lane(d, 2, [1, 5]),
    "a float time": lambda d: _lane(d, 7, [0.5] * len(_trace(d)["lanes"][0][7])),
    "an order that places too many": lambda d: _set(d, "order", [0] * 50),
    "an order that places too few": lambda d: _set(d, "order", [0]),
    "two lanes without their order": lambda d: _set(d, "order", None),
    "a frame file index out of range": lambda d: _set(d, "frames", [[[5, 1, "f"]]]),
    "a string too long": lambda d: _set(d, "sigs", [["gloo:" + "x" * 600, [], [], None, None]]),
    "sizes nested too deep": lambda d: _set(d, "sigs", [["gloo:all_reduce", [[[4]]], [], None, None]]),
    "a stack frame that breaks the file": lambda d: dict(d, stack=[['a"b', 1, "f"]]),
    "a stack line of text": lambda d: dict(d, stack=[["a.py", "1", "f"]]),
    "a context that is a list": lambda d: dict(d, context=[1, 2]),
    "too many traces": lambda d: dict(d, traces=[_trace(d)] * 9),
    "deep nesting": lambda d: json.loads("[" * 50 + "]" * 50) and dict(d, traces="[" * 100000),
}


def _set(doc: dict, key: str, value: object) -> dict:
    _trace(doc)[key] = value
    return doc


def _lane(doc: dict, column: int, value: object) -> dict:
    _trace(doc)["lanes"][0][column] = value
    return doc


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_planted_digest_is_refused_with_a_reason(tmp_path, case):
    doc = CASES[case](_valid(tmp_path))
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(DigestError) as error:
        expand_digest(raw, 3, WORLD)
    assert str(error.value)


def test_deeply_nested_json_and_an_oversized_digest_are_refused_before_anything_is_built():
    with pytest.raises(DigestError):
        expand_digest(b"[" * 200_000 + b"]" * 200_000, 3, WORLD)
    with pytest.raises(DigestError, match="cap"):
        expand_digest(b" " * (MAX_DIGEST_JSON + 1), 3, WORLD)


def test_random_changes_to_a_digest_give_a_refusal_or_files_never_anything_else(tmp_path):
    valid = json.dumps(_valid(tmp_path)).encode()
    rng = random.Random(28)
    refused = 0
    for _ in range(3000):
        raw = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(raw))
            raw[at:at + 1] = bytes([rng.choice(b'0123456789-[]{},":nulltrue')])
        try:
            files = expand_digest(bytes(raw), 3, WORLD)
        except DigestError:
            refused += 1
            continue
        assert "rank_00003.context.json" in files
        for name, data in files.items():
            assert re.fullmatch(r"rank_00003\.(context\.json|stacks\.txt|[a-z0-9_]{1,32}\.fr\.pkl)", name), name
            for group in (safe_loads(data).get("pg_config", {}).values() if name.endswith(".pkl") else ()):
                assert all(0 <= int(r) < WORLD for r in json.loads(group["ranks"]))
    assert 0 < refused < 3000
