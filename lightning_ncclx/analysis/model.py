"""Frozen types that flow through the analysis: load -> align -> diagnose -> :class:`Summary`.

The bulk per-entry data stays in compact arrays inside :class:`GroupTrack` (one per rank and group);
only what a report shows becomes a dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, NamedTuple, Sequence

import lightning_ncclx.analysis.rank_sets as rank_sets

SCHEMA = "lightning-ncclx/summary/2"
"""``summary.json``'s schema (``docs/summary-json.md``); 2: rank sets as ranges past 64 ranks, the
per-rank maps grouped by value, the per-rank detail in :data:`RANK_DETAIL_SCHEMA`'s file."""
RANK_DETAIL_SCHEMA = "lightning-ncclx/summary-ranks/1"
_GROUPED_CONTEXT = (("phase_by_rank", "phase_ranks"), ("step_by_rank", "step_ranks"),
                    ("exceptions", "exception_ranks"))
"""Per-rank maps of ``Summary.context`` and the grouped names ``summary.json`` writes them as."""
MAX_LISTED_LOCATIONS = 64
"""Hosts whose dump folders ``summary.json`` lists (the culprits' first); every host's are in
the per-rank detail file."""

# One collective as a rank saw it: (op, input_sizes, input_dtypes, output_sizes, output_dtypes),
# canonical: sizes as tuples of tuples, dtypes as tuples, so signatures compare and hash.
Sig = tuple


class Verdict(str, Enum):
    """What the dumps say, most specific first. ``str`` so it serializes as its value."""

    NOT_ENTERED = "not_entered"
    OP_MISMATCH = "op_mismatch"
    SIZE_MISMATCH = "size_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    EXTRA_COLLECTIVE = "extra_collective"
    DUMP_MISSING = "dump_missing"
    STALLED = "stalled"
    """No rank is the odd one, and yet the job stopped: every rank in the same collective, or every
    rank in the program (hang kinds ``collective_stalled`` and ``program_stalled``)."""
    NO_HANG = "no_hang"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GroupTrack:
    """One rank's collectives in one process group, ascending by ``collective_seq_id``.

    Compact parallel columns, one slot per sequence id (coalesced entries sharing an id are
    merged): ``seqs`` and ``times_ns`` are ``array('q')``, ``done`` is ``bytes`` (1 = finished),
    ``sig_ids`` holds a stable 64-bit id per slot (equal signatures have equal ids on every rank
    and in every process), decoded through ``sig_table``. Only the newest slots keep a call site
    (``callsite_tail``). No per-entry Python objects: 1024 ranks x 2000 entries stay small.
    """

    lib: str
    name: str
    desc: str
    seqs: Sequence[int]
    sig_ids: Sequence[int]
    sig_table: Mapping[int, Sig]
    done: bytes
    times_ns: Sequence[int]
    callsite_tail: tuple[str | None, ...] = ()

    @property
    def newest_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    @property
    def oldest_seq(self) -> int:
        return self.seqs[0] if self.seqs else 0

    def sig(self, index: int) -> Sig:
        """The decoded signature of slot ``index``."""
        return self.sig_table[self.sig_ids[index]]

    @property
    def sigs(self) -> tuple[Sig, ...]:
        """Every slot's decoded signature (materialized on demand; not for hot paths)."""
        table = self.sig_table
        return tuple(table[i] for i in self.sig_ids)

    @property
    def callsites(self) -> tuple[str | None, ...]:
        """One call site per slot, None outside the newest ``len(callsite_tail)`` slots."""
        return (None,) * (len(self.seqs) - len(self.callsite_tail)) + tuple(self.callsite_tail)

    def callsites_between(self, a: int, b: int) -> tuple[str | None, ...]:
        """``callsites[a:b]`` without building the whole column."""
        start = len(self.seqs) - len(self.callsite_tail)
        if a >= start:
            return tuple(self.callsite_tail[a - start:b - start])
        return (None,) * (min(b, start) - a) + tuple(self.callsite_tail[:max(0, b - start)])

    def callsite(self, index: int) -> str | None:
        start = len(self.seqs) - len(self.callsite_tail)
        return self.callsite_tail[index - start] if index >= start else None


@dataclass(frozen=True)
class OpenOp:
    """An operation a rank had entered and not finished when it dumped (its in-flight op)."""

    lib: str
    group: str
    desc: str
    seq: int
    op: str
    is_p2p: bool
    state: str
    time_ns: int
    frames: tuple[str, ...] = ()

    def describe(self) -> str:
        kind = "p2p" if self.is_p2p else "seq"
        return f"{self.op} ({kind} {self.seq}) in group {self.group} ({self.desc})"


@dataclass(frozen=True)
class P2POp:
    """A point-to-point entry: ``op`` is send or recv, ``peer`` a group rank (-1 unknown)."""

    group: str
    op: str
    src: int
    dst: int
    seq: int
    done: bool
    sizes: tuple = ()
    """The tensor's sizes (input sizes, else output sizes) and dtypes, to compare a pair."""
    dtypes: tuple = ()


@dataclass(frozen=True)
class RankTrace:
    """Everything the analysis needs from one rank's dump of one backend."""

    rank: int
    lib: str
    path: str
    version: str
    pg_config: Mapping[str, tuple[str, tuple[int, ...]]]
    groups: Mapping[str, GroupTrack]
    p2p: tuple[P2POp, ...]
    open_ops: tuple[OpenOp, ...]
    n_entries: int
    newest_ns: int
    fmt: str = ""
    """How the file was stored: ``pickle``, ``json``, ``gzip+pickle``, ``gzip+json``."""
    rank_from: str = ""
    """Where ``rank`` came from: ``content``, ``context``, ``layout``, ``file name``, ``folder name``."""
    comm_lib_version: str = ""
    cut: tuple[str, ...] = ()
    """What of the file was not read, past the reader's bounds ("it holds 383,781 entries; the
    newest 65,536 were read"): the summary's notes repeat it."""
    pg_status: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Group name -> (last op enqueued, last op completed) as torch's own watchdog saw them
    (``pg_status``; -1 where it does not keep one): with NCCL timing off the only word on whether
    an entry still reading ``scheduled`` finished on the GPU."""


@dataclass(frozen=True)
class RankContext:
    """The parts of ``rank_<R>.context.json`` the analysis uses (every field optional)."""

    rank: int
    path: str
    host: str | None = None
    world_size: int | None = None
    pg_config: Mapping[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    phase: str | None = None
    step: int | None = None
    reason: str | None = None
    event: str | None = None
    exception: str | None = None
    initiator_rank: int | None = None
    p2p_in_flight: tuple[tuple[str, P2POp], ...] = ()
    """(backend, op) of the sends/recvs the rank had in flight that its recorder does not hold
    (context.json ``p2p_in_flight``: gloo records none); ``seq`` is the group's op id."""
    seconds_since_heartbeat: float | None = None
    """How long the rank's training loop had not moved when it dumped (its watchdog's view)."""
    time_unix: float | None = None
    """When the rank wrote its dump (its own clock)."""
    stall_threshold_seconds: float | None = None
    """The step threshold its watchdog held the heartbeat against."""


@dataclass(frozen=True)
class RankAtDump:
    """A rank when it dumped: its main thread's innermost user frame, the library wait it was in if
    known (data loader, lock, GPU sync ...), the heartbeat's age and the dump's time from its
    context, and whether torch's watchdog saw its oldest unfinished op complete (None: unknown)."""

    frame: str | None = None
    activity: str | None = None
    seconds_since_heartbeat: float | None = None
    time_unix: float | None = None
    open_op_completed: bool | None = None
    stall_threshold_seconds: float | None = None


@dataclass(frozen=True)
class Unreadable:
    path: str
    why: str


@dataclass(frozen=True)
class InputFile:
    """One dump file that was read (``Summary.inputs``)."""

    path: str
    rank: int
    rank_from: str
    backend: str
    fmt: str
    version: str
    comm_lib_version: str
    entries: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rank": self.rank, "rank_from": self.rank_from, "backend": self.backend,
                "format": self.fmt, "version": self.version, "comm_lib_version": self.comm_lib_version,
                "entries": self.entries}


@dataclass(frozen=True)
class Duplicate:
    """Two files claiming one rank and backend: the one with the newest entries is kept."""

    rank: int
    backend: str
    kept: str
    dropped: str

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "backend": self.backend, "kept": self.kept, "dropped": self.dropped}


@dataclass(frozen=True)
class Recovery:
    """Every rank moved on after the event was raised: a wait that ended, not a hang. The
    evidence was taken while it lasted; the event does not count as a hang anywhere."""

    lasted_seconds: float
    ranks_moved_on: int | None = None

    @property
    def message(self) -> str:
        return (f"recovered after {self.lasted_seconds:.1f} s: not a hang (every rank moved on; what follows "
                "was taken while the ranks waited)")

    def to_dict(self) -> dict[str, Any]:
        return {"recovered": True, "lasted_seconds": round(self.lasted_seconds, 3),
                "ranks_moved_on": self.ranks_moved_on, "message": self.message}


@dataclass(frozen=True)
class LoadedFolder:
    """The result of the only I/O stage."""

    root: str
    traces: tuple[RankTrace, ...]
    contexts: Mapping[int, RankContext]
    stacks: Mapping[int, str]  # rank -> main thread's innermost user frame
    unreadable: tuple[Unreadable, ...]
    dump_locations: Mapping[str, tuple[str, ...]]
    gone_ranks: tuple[int, ...] = ()
    """Ranks whose process had exited when the watchdog collected the dumps."""
    silent_ranks: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Ranks alive but without a dump: ``{"pid", "host", "state"}`` (``/proc`` state letter)."""
    activities: Mapping[int, str] = field(default_factory=dict)
    """rank -> the known library wait its main thread is in (data loader, checkpoint, ...)."""
    ignored: tuple[Unreadable, ...] = ()
    """Files skipped as not being dumps (or too large, not regular files): path and reason."""
    duplicates: tuple[Duplicate, ...] = ()
    warnings: tuple[str, ...] = ()
    """Things the loader noticed (a rank in a name that the content contradicts)."""
    digest_only_ranks: tuple[int, ...] = ()
    """Ranks read from a digest (two-phase gather): their newest collectives per group only."""
    recovery: Recovery | None = None
    """Set when the watchdog saw the event recover (``collection.json``)."""
    refused: tuple[str, ...] = ()
    """Store values and packed members the watchdog left out of the event, with the reason."""
    gone_exits: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Gone rank -> how its process ended (``collection.json``'s ``gone_exits``, checked)."""


@dataclass(frozen=True)
class GroupRef:
    name: str
    desc: str
    ranks: tuple[int, ...]
    lib: str = ""
    membership_known: bool = True
    """False when no ``pg_config`` declared the group (raw gloo dumps): ``ranks`` are then only
    the ranks whose dumps mention it, and a member that recorded nothing in it is not among them."""

    def to_dict(self, ranges: bool = False) -> dict[str, Any]:
        return {"name": self.name, "desc": self.desc, "ranks": rank_sets.encode(self.ranks, ranges),
                "backend": self.lib, "membership_known": self.membership_known}


@dataclass(frozen=True)
class CulpritState:
    """Where a culprit rank was: ``in_collective`` (which one), ``outside_collective``, ``no_dump``,
    ``process_gone`` (no dump, and its process had exited when the dumps were collected),
    ``no_answer`` (no dump, though its process was alive: its watchdog could not run)."""

    rank: int
    state: str
    detail: str
    location: str | None = None
    group: tuple[str, str] | None = None  # (backend, group name) of the collective it is in

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "state": self.state, "detail": self.detail, "location": self.location,
                "in_group": self.group[1] if self.group else None}


def sig_dict(sig: Sig | None) -> dict[str, Any] | None:
    if sig is None:
        return None
    op, in_sizes, in_dtypes, out_sizes, out_dtypes = sig
    return {"op": op, "input_sizes": _lists(in_sizes), "input_dtypes": list(in_dtypes),
            "output_sizes": _lists(out_sizes), "output_dtypes": list(out_dtypes)}


def _lists(sizes: Any) -> Any:
    return [_lists(s) for s in sizes] if isinstance(sizes, tuple) else sizes


@dataclass(frozen=True)
class Wait:
    """A rank blocked on others in a chain of waits that ends at a finding's culprits: in a recv
    (on its sender), a send (on its receiver) or a collective (on the ranks that never entered it)."""

    rank: int
    op: str
    """What it is blocked in: ``recv from rank 1 (p2p 8) of group 1 (ranks 0-2, gloo)``."""
    on: tuple[int, ...]
    """The ranks it waits on directly (a culprit, or another rank of the chain)."""

    def to_dict(self, ranges: bool = False) -> dict[str, Any]:
        return {"rank": self.rank, "in": self.op, "on": rank_sets.encode(self.on, ranges)}


@dataclass(frozen=True)
class Finding:
    """One thing that went wrong in one process group, at one sequence id."""

    kind: Verdict
    ranks: tuple[int, ...]
    group: GroupRef
    seq: int
    op: str
    expected: Sig | None
    observed: Mapping[int, Sig | None]
    waiting_ranks: tuple[int, ...]
    culprit_states: tuple[CulpritState, ...]
    message: str
    confidence: str = "high"
    time_ns: int = 0
    evidence: tuple[str, ...] = ()
    waits: tuple[Wait, ...] = ()
    """The ranks blocked, directly or through others, on this finding's culprits, where the chain
    runs through a send or recv (:mod:`lightning_ncclx.analysis.wait_chains`)."""

    def to_dict(self, ranges: bool = False) -> dict[str, Any]:
        """``ranges``: rank sets as strings of ranges (:mod:`rank_sets`), else lists."""
        exp = sig_dict(self.expected) or {}
        return {
            "kind": self.kind.value, "ranks": rank_sets.encode(self.ranks, ranges),
            "group": self.group.to_dict(ranges), "seq": self.seq, "op": self.op,
            "sizes": exp.get("input_sizes"), "dtypes": exp.get("input_dtypes"),
            "expected": sig_dict(self.expected),
            "observed": {str(r): sig_dict(s) for r, s in sorted(self.observed.items())},
            "waiting_ranks": rank_sets.encode(self.waiting_ranks, ranges),
            "culprit_states": [c.to_dict() for c in self.culprit_states],
            "message": self.message, "confidence": self.confidence, "evidence": list(self.evidence),
            "waits": [w.to_dict(ranges) for w in self.waits],
        }


@dataclass(frozen=True)
class Straggler:
    """How late ``rank`` entered collectives of one group, relative to the earliest rank."""

    lib: str
    group: str
    desc: str
    rank: int
    median_late_ms: float
    p95_late_ms: float
    last_fraction: float
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.lib, "group": self.group, "desc": self.desc, "rank": self.rank,
                "median_late_ms": round(self.median_late_ms, 3), "p95_late_ms": round(self.p95_late_ms, 3),
                "last_fraction": round(self.last_fraction, 3), "samples": self.samples}


class TimelineOp(NamedTuple):
    """One collective of a rank's timeline. A named tuple, not a dataclass: a 16,384-rank summary
    makes 327,680 of them, and a tuple is made three times faster."""

    group: str
    seq: int
    op: str
    done: bool
    time_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "seq": self.seq, "op": self.op, "done": self.done, "time_ns": self.time_ns}


@dataclass(frozen=True)
class RankRow:
    """One row of the per-rank state table."""

    rank: int
    host: str | None
    state: str
    detail: str
    location: str | None
    timeline: tuple[TimelineOp, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "state": self.state, "detail": self.detail,
                "location": self.location, "timeline": [t.to_dict() for t in self.timeline]}


@dataclass(frozen=True)
class Summary:
    """The diagnosis of one folder of dumps. ``to_dict()`` is the documented JSON form
    (``docs/summary-json.md``).

    Example::

        summary = analyze_folder("ncclx_dumps/stall-001")
        if summary.verdict is not Verdict.NO_HANG:
            print(summary.culprit_ranks, summary.findings[0].message)
    """

    source: str
    verdict: Verdict
    culprit_ranks: tuple[int, ...]
    process_group: GroupRef | None
    collective_seq_id: int | None
    op: str | None
    waiting_ranks: tuple[int, ...]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    unreadable: tuple[Unreadable, ...]
    ranks_seen: tuple[int, ...]
    ranks_missing: tuple[int, ...]
    hosts: Mapping[int, str]
    dump_locations: Mapping[str, tuple[str, ...]]
    stragglers: tuple[Straggler, ...]
    per_rank: tuple[RankRow, ...]
    context: Mapping[str, Any]
    schema: str = SCHEMA
    inputs: tuple[InputFile, ...] = ()
    """Every dump file read, with its rank and where that rank came from."""
    ignored: tuple[Unreadable, ...] = ()
    duplicates: tuple[Duplicate, ...] = ()
    classification: Any = None
    """The hang kind, advice and restart decision (``analysis.kind.Classification``), set by the
    analyzer once the rest is known."""
    recovery: Recovery | None = None
    """Set when every rank moved on after the event: a wait that ended, not a hang."""
    at_dump: Mapping[int, RankAtDump] = field(default_factory=dict, compare=False)
    """Each dumped rank when it dumped (where its main thread was ...), for the hang kind when no
    finding names a rank; not part of the JSON form (``per_rank`` holds what a report shows)."""

    @property
    def headline(self) -> str:
        if self.findings:
            return self.findings[0].message
        kind = getattr(getattr(self.classification, "kind", None), "value", None)
        if kind == "program_stalled":  # the ranks agree on their collectives, and yet none moves
            return f"program_stalled: {self.classification.reason}"
        return self.notes[0] if self.notes else "no hang: all ranks agree"

    @property
    def uses_ranges(self) -> bool:
        """Whether ``to_dict`` writes rank sets as ranges (past 64 ranks seen and missing)."""
        return rank_sets.uses_ranges(len(self.ranks_seen) + len(self.ranks_missing))

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON form (``summary.json``, schema 2). ``per_rank`` and ``inputs`` hold
        every row up to 256 ranks; beyond, the culprits' rows and one per class of alike ranks
        (``rank_classes`` and ``input_classes`` name every rank). Rank sets are lists of ranks up
        to 64 ranks, else strings of ranges; per-rank maps are grouped by value (``host_ranks``).
        What is per rank in full is :meth:`rank_detail`'s (``summary-ranks.json``)."""
        from lightning_ncclx.analysis import rank_classes as tables

        ranges = self.uses_ranges
        culprits = {r for f in self.findings for r in f.ranks[:1000]}  # rows exist for at most 1000 per finding
        c = self.classification
        locations = sorted(self.dump_locations.items())
        if len(locations) > MAX_LISTED_LOCATIONS:
            culprit_hosts = {self.hosts.get(r) for r in self.culprit_ranks[:1000]}
            locations = sorted(sorted(locations, key=lambda hp: hp[0] not in culprit_hosts)[:MAX_LISTED_LOCATIONS])
        return {
            "schema": self.schema, "source": self.source, "verdict": self.verdict.value,
            "hang_kind": c.kind.value if c else None, "hang_kind_reason": c.reason if c else None,
            "advice": list(c.advice) if c else [], "restart_advice": c.restart_advice() if c else None,
            "hosts_to_exclude": list(c.hosts_to_exclude) if c else [],
            "headline": self.headline,
            "recovery": self.recovery.to_dict() if self.recovery is not None else None,
            "culprit_ranks": rank_sets.encode(self.culprit_ranks, ranges),
            "process_group": self.process_group.to_dict(ranges) if self.process_group else None,
            "collective_seq_id": self.collective_seq_id, "op": self.op,
            "waiting_ranks": rank_sets.encode(self.waiting_ranks, ranges),
            "findings": [f.to_dict(ranges) for f in self.findings],
            "notes": list(self.notes),
            "unreadable": [{"path": u.path, "why": u.why} for u in self.unreadable],
            "ranks_seen": rank_sets.encode(self.ranks_seen, ranges),
            "ranks_missing": rank_sets.encode(self.ranks_missing, ranges),
            "host_ranks": rank_sets.group(self.hosts, ranges),
            "dump_locations": {h: list(p) for h, p in locations},
            "dump_locations_left_out": len(self.dump_locations) - len(locations),
            "stragglers": [s.to_dict() for s in self.stragglers],
            "per_rank": [r.to_dict() for r in tables.to_write(self.per_rank, culprits, tables.row_key)],
            "rank_classes": tables.classes(self.per_rank, tables.row_key, tables.row_class, ranges),
            "context": _grouped_context(self.context, ranges),
            "inputs": [i.to_dict() for i in tables.to_write(self.inputs, culprits, tables.input_key)],
            "input_classes": tables.classes(self.inputs, tables.input_key, tables.input_class, ranges),
            "ignored": [{"path": u.path, "why": u.why} for u in self.ignored],
            "duplicates": [d.to_dict() for d in self.duplicates],
            "rank_detail": None,
        }

    def rank_detail(self) -> dict[str, Any]:
        """What ``summary.json`` holds grouped or in part, per rank and in full: the per-rank
        detail file (``summary-ranks.json``, schema :data:`RANK_DETAIL_SCHEMA`). Every rank's
        row (its timeline cut to its newest collective), host, phase, step and exception, every
        host's dump folders, every input file."""
        context = self.context
        return {
            "schema": RANK_DETAIL_SCHEMA, "source": self.source,
            "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
            "phase_by_rank": dict(context.get("phase_by_rank") or {}),
            "step_by_rank": dict(context.get("step_by_rank") or {}),
            "exceptions": dict(context.get("exceptions") or {}),
            "dump_locations": {h: list(p) for h, p in sorted(self.dump_locations.items())},
            "per_rank": [{"rank": r.rank, "host": r.host, "state": r.state, "detail": r.detail,
                          "location": r.location, "timeline": [t.to_dict() for t in r.timeline[-1:]]}
                         for r in self.per_rank],
            "inputs": [i.to_dict() for i in self.inputs],
        }


def _grouped_context(context: Mapping[str, Any], ranges: bool) -> dict[str, Any]:
    """``context`` as ``summary.json`` writes it: each per-rank map grouped by value."""
    out = dict(context)
    for name, grouped in _GROUPED_CONTEXT:
        by_rank = out.pop(name, None)
        if isinstance(by_rank, Mapping):
            out[grouped] = rank_sets.group({int(r): v for r, v in by_rank.items() if str(r).isdigit() and v is not None},
                                          ranges)
    return out
