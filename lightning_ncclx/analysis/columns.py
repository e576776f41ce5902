"""Column-wise extraction of one rank's entries into compact arrays: the analyzer's hot loop.

Every column is built by C-level iteration (``map`` over ``operator.itemgetter``, ``array``,
``bytes``), never by a Python loop per entry. Signatures are keyed per entry by the ``marshal``
bytes of the raw fields (version 4: an object the entry shares is written once, so a memo-shared
hostile pickle stays small here; honest dumps share alike in every entry, so equal values give
equal bytes, and where they do not only the number of distinct keys grows); each distinct key is
decoded once into a canonical :data:`Sig` (checked two levels deep, see ``_listed``) and given a
stable 64-bit id (:func:`sig_id`), so ids compare across ranks and processes. Dumps with missing or odd fields
take the per-entry ``dict.get`` path, with the same result.
"""

from __future__ import annotations

import marshal
from array import array
from hashlib import blake2b
from itertools import repeat
from operator import eq, itemgetter, or_, truth
from typing import Any, Sequence

from lightning_ncclx.analysis.model import Sig

NAME_CHARS = 200
"""Op, dtype, group names and descriptions longer than this are cut (as ``pg_config`` names are):
a name is text for a report, and a hostile dump's 100 MB one must not reach it."""
SIG_FIELDS = ("profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes")
_KEY = itemgetter(*SIG_FIELDS)
_SEQ = itemgetter("collective_seq_id")
_TIME = itemgetter("time_created_ns")
_STATE = itemgetter("state")
_RETIRED = itemgetter("retired")


def freeze(value: Any) -> Any:
    """Lists (as dumps hold sizes) -> tuples, so a signature can be hashed and counted."""
    return tuple(freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


# Ops whose buffers legitimately differ between the ranks of one call: only gather's root has
# outputs, only scatter's root has inputs, and all_to_all / the "v" collectives take per-rank
# sizes. Those fields are left out of the signature (empty), as torch's own analyzer skips them;
# comparing them would call every healthy gather a size mismatch and blame its root.
_ROOT_ONLY_OUTPUTS = frozenset({"gather"})
_ROOT_ONLY_INPUTS = frozenset({"scatter"})
_PER_RANK_INPUT_SIZES = frozenset({"all_gather_v"})
_PER_RANK_OUTPUT_SIZES = frozenset({"reduce_scatter_v"})


def _per_rank_sizes(op: str) -> bool:
    return "all_to_all" in op or "alltoall" in op


_SEQUENCES = (list, tuple)


def _listed(e: dict, key: str) -> tuple:
    """Sizes as a tuple of shapes (tuples of ints, or ints), dtypes as a tuple of strings. Looks
    only two levels down, so a memo-shared structure of any depth is refused, never walked."""
    value = e.get(key) or ()
    if type(value) not in _SEQUENCES:
        raise ValueError(f"{key} is {type(value).__name__}, not a list")
    if key.endswith("dtypes"):
        if not all(type(v) is str for v in value):
            raise ValueError(f"{key} holds something other than strings")
        return tuple(v[:NAME_CHARS] for v in value)
    out = []
    for shape in value:
        if type(shape) is int:
            out.append(shape)
        elif type(shape) in _SEQUENCES and all(type(n) is int for n in shape):
            out.append(tuple(shape))
        else:
            raise ValueError(f"{key} holds {type(shape).__name__} or nests too deep")
    return tuple(out)


def canonical_sig(e: dict) -> Sig:
    """(op, input_sizes, input_dtypes, output_sizes, output_dtypes) of one entry, frozen, with the
    fields that may differ between ranks of a healthy call left empty (see above). Op and dtype
    names are cut to :data:`NAME_CHARS`."""
    op = e["profiling_name"].rpartition(":")[2][:NAME_CHARS]
    in_sizes, in_dtypes = _listed(e, "input_sizes"), _listed(e, "input_dtypes")
    out_sizes, out_dtypes = _listed(e, "output_sizes"), _listed(e, "output_dtypes")
    if op in _ROOT_ONLY_OUTPUTS:
        out_sizes, out_dtypes = (), ()
    elif op in _ROOT_ONLY_INPUTS:
        in_sizes, in_dtypes = (), ()
    elif op in _PER_RANK_INPUT_SIZES:
        in_sizes = ()
    elif op in _PER_RANK_OUTPUT_SIZES:
        out_sizes = ()
    elif _per_rank_sizes(op):
        in_sizes, out_sizes = (), ()
    return (op, in_sizes, in_dtypes, out_sizes, out_dtypes)


def sig_id(sig: Sig) -> int:
    """A stable signed 64-bit id of a canonical signature (same in every process and run)."""
    return int.from_bytes(blake2b(repr(sig).encode(), digest_size=8).digest(), "little", signed=True)


def sig_columns(es: Sequence[dict], key: itemgetter = _KEY) -> tuple[array, dict[int, Sig]]:
    """Per entry signature ids (``array('q')``) and the id -> signature table. ``key``: an
    itemgetter of :data:`SIG_FIELDS` (the dump's own key objects, see ``compact.own_getter``)."""
    try:
        keys: list = list(map(marshal.dumps, map(key, es), repeat(4)))
    except (KeyError, ValueError, TypeError):  # missing fields or unmarshallable values: slow path
        keys = [canonical_sig(e) for e in es]
        ids = {k: sig_id(k) for k in dict.fromkeys(keys)}
        return array("q", list(map(ids.__getitem__, keys))), {i: k for k, i in ids.items()}
    known = _KNOWN_SIGS
    found = {k: known.get(k) or _learn(k, e) for k, e in dict(zip(keys, es)).items()}  # once per distinct key
    return array("q", [found[k][0] for k in keys]), dict(found.values())


_KNOWN_SIGS: dict[bytes, tuple[int, Sig]] = {}
"""Signature keys this process has decoded (a rank's dump repeats the same few dozen, and so do
its peers'), at most :data:`_KNOWN_MAX` of at most :data:`_KNOWN_KEY_BYTES` each."""
_KNOWN_MAX = 4096
_KNOWN_KEY_BYTES = 512


def _learn(key: bytes, e: dict) -> tuple[int, Sig]:
    sig = canonical_sig(e)
    got = (sig_id(sig), sig)
    if len(key) <= _KNOWN_KEY_BYTES:
        if len(_KNOWN_SIGS) >= _KNOWN_MAX:
            _KNOWN_SIGS.clear()
        _KNOWN_SIGS[key] = got
    return got


def done_column(es: Sequence[dict], lib: str) -> bytes:
    """1 where the entry finished: gloo never leaves ``scheduled``, so ``retired`` is its only
    progress signal; NCCL-like: ``state == "completed"`` or retired."""
    try:
        retired = map(truth, map(_RETIRED, es))
        if lib == "gloo":
            return bytes(retired)
        return bytes(map(or_, map(eq, map(_STATE, es), repeat("completed")), retired))
    except KeyError:
        if lib == "gloo":
            return bytes(bool(e.get("retired")) for e in es)
        return bytes(e.get("state") == "completed" or bool(e.get("retired")) for e in es)


def int_column(es: Sequence[dict], getter: itemgetter, key: str) -> array:
    """``array('q')`` of one integer field; missing or None reads as 0."""
    try:
        return array("q", list(map(getter, es)))
    except (KeyError, TypeError):
        return array("q", [e.get(key) or 0 for e in es])


def seq_column(es: Sequence[dict]) -> array:
    return array("q", map(_SEQ, es))


def time_column(es: Sequence[dict], getter: itemgetter = _TIME) -> array:
    return int_column(es, getter, "time_created_ns")


def open_indices(done: bytes) -> list[int]:
    """Positions of unfinished entries (few: a rank has one or two ops in flight)."""
    out = []
    i = done.find(0)
    while i >= 0:
        out.append(i)
        i = done.find(0, i + 1)
    return out
