"""From loaded dumps to a :class:`Summary`: per group divergence -> findings -> verdict. Pure."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import Counter
from dataclasses import replace
from typing import Mapping

from lightning_ncclx.analysis.align import Divergence, _time_at, callsite_divergence, diverge, sig_at
from lightning_ncclx.analysis.columns import sig_id
from lightning_ncclx.analysis.op_rules import rule_broken
from lightning_ncclx.analysis.groups import resolve_groups, world_size
from lightning_ncclx.analysis.model import (CulpritState, Finding, GroupRef, GroupTrack, InputFile, LoadedFolder, RankTrace,
                                            Sig, Summary, Verdict)
from lightning_ncclx.analysis.order import departs_from_own_order, keeps_period, period_breakers, program
from lightning_ncclx.analysis.p2p import p2p_findings
from lightning_ncclx.analysis.ranks import RankStates, culprit_state, rank_rows
from lightning_ncclx.analysis.skew import group_stragglers


def classify_mismatch(majority: Sig | None, sigs: Mapping[int, Sig | None], odd: tuple[int, ...]) -> Verdict:
    """op_mismatch / size_mismatch / dtype_mismatch / not_entered from the odd ranks' signatures."""
    if majority is None:  # a tie: compare every signature with the first one present
        reference = next((s for s in sigs.values() if s is not None), None)
        others = [s for s in sigs.values() if s != reference]
    else:
        reference, others = majority, [sigs[r] for r in odd]
    kinds = []
    for s in others:
        if s is None or reference is None:
            kinds.append(Verdict.NOT_ENTERED)
        elif s[0] != reference[0]:
            kinds.append(Verdict.OP_MISMATCH)
        elif s[1] != reference[1] or s[3] != reference[3]:
            kinds.append(Verdict.SIZE_MISMATCH)
        elif s[2] != reference[2] or s[4] != reference[4]:
            kinds.append(Verdict.DTYPE_MISMATCH)
    for kind in (Verdict.OP_MISMATCH, Verdict.SIZE_MISMATCH, Verdict.DTYPE_MISMATCH):
        if kind in kinds:
            return kind
    return Verdict.NOT_ENTERED


def _sizes(sizes: tuple) -> str:
    return ",".join("x".join(map(str, x)) if isinstance(x, tuple) else str(x) for x in sizes)


def _short(sig: Sig | None) -> str:
    """``op[in sizes->out sizes]/in dtypes->out dtypes``; outputs only where they differ."""
    if sig is None:
        return "nothing"
    op, in_sizes, in_dtypes, out_sizes, out_dtypes = sig
    sizes = _sizes(in_sizes)
    if out_sizes and out_sizes != in_sizes:
        sizes = f"{sizes or '-'}->{_sizes(out_sizes)}"
    dtypes = ",".join(in_dtypes)
    if out_dtypes and out_dtypes != in_dtypes:
        dtypes = f"{dtypes or '-'}->{','.join(out_dtypes)}"
    return f"{op}[{sizes or '-'}]{'/' + dtypes if dtypes else ''}"


def _ranks(r: tuple[int, ...]) -> str:
    return ", ".join(map(str, r)) if len(r) <= 12 else f"{', '.join(map(str, r[:10]))}, ... ({len(r)} ranks)"


def _group_label(g: GroupRef) -> str:
    return f"group {g.name} ({g.desc or 'no desc'}, {g.lib})"


def _by_own_period(div: Divergence, tracks: Mapping[int, GroupTrack]) -> tuple[Divergence, str] | None:
    """A tie (no majority) settled by program order: the one rank whose call at ``div.seq`` breaks
    the period of its own earlier calls in the group, while every other rank keeps its period."""
    breakers = period_breakers({r: tracks[r] for r in div.culprits if r in tracks}, div.seq)
    if len(breakers) != 1:
        return None
    (culprit, (expected, _)), = breakers.items()
    others = tuple(r for r in div.culprits if r != culprit)
    if not others or not all(r in tracks and keeps_period(tracks[r], div.seq) for r in others):
        return None
    majority = div.sigs.get(others[0])
    steps = tracks[culprit]
    site = expected[1] or "the same call site"
    why = (f"no majority, but rank {culprit} broke the pattern of its own earlier steps (there it called "
           f"{_short(steps.sig_table.get(expected[0]))} from {site}) while rank(s) {_ranks(others)} kept theirs")
    return replace(div, majority=majority, culprits=(culprit,), waiting=others, confidence="medium"), why


def finding_from(group: GroupRef, div: Divergence, tracks: Mapping[int, GroupTrack],
                 states: Mapping[int, CulpritState]) -> Finding:
    why = None
    if div.kind == "mismatch" and div.majority is None:
        settled = _by_own_period(div, tracks)
        if settled is not None:
            div, why = settled
    op = (div.majority or next((s for s in div.sigs.values() if s), ("?",)))[0]
    if div.kind == "mismatch":
        kind = classify_mismatch(div.majority, div.sigs, div.culprits)
        if div.majority is None:
            detail = "; ".join(f"rank {r}: {_short(div.sigs[r])}" for r in div.culprits)
            msg = (f"{kind.value}: ranks of {_group_label(group)} disagree at seq {div.seq} with no majority "
                   f"({detail}); cannot tell which rank is wrong")
        else:
            called = {_short(div.sigs[r]) for r in div.culprits}
            theirs = called.pop() if len(called) == 1 else "; ".join(
                f"rank {r}: {_short(div.sigs[r])}" for r in div.culprits)
            msg = (f"{kind.value}: rank(s) {_ranks(div.culprits)} called {theirs} at seq {div.seq} of "
                   f"{_group_label(group)} where the others called {_short(div.majority)}")
            if why:
                msg += f": {why}"
    else:
        kind = Verdict.NOT_ENTERED
        msg = (f"not_entered: rank(s) {_ranks(div.culprits)} never entered {op} (seq {div.seq}) of "
               f"{_group_label(group)}; rank(s) {_ranks(div.waiting)} are waiting in it")
    evidence = []
    cs = callsite_divergence(tracks) if div.kind in ("mismatch", "behind") else None
    if cs is not None:
        seq, sites = cs
        evidence.append(f"call sites first differ at seq {seq}: " + "; ".join(
            f"rank {r}: {s or '?'}" for r, s in sorted(sites.items())))
    culprit_states = tuple(states[r] for r in div.culprits if r in states)
    observed = {r: div.sigs.get(r) for r in div.culprits}
    return Finding(kind, div.culprits, group, div.seq, op, div.majority, observed, div.waiting, culprit_states,
                   msg, div.confidence, div.time_ns, tuple(evidence))


def rule_finding(group: GroupRef, tracks: Mapping[int, GroupTrack], states: Mapping[int, CulpritState]
                 ) -> Finding | None:
    """The first collective of ``group`` whose recorded sizes break the op's own rule
    (:mod:`op_rules`), on any rank: a size_mismatch even when every rank recorded the same."""
    size = len(group.ranks) if group.membership_known else None
    broken: dict[int, str] = {}
    for t in tracks.values():
        for sid, sig in t.sig_table.items():
            if sid not in broken:
                broken[sid] = rule_broken(sig, size) or ""
    bad = {sid for sid, rule in broken.items() if rule}
    if not bad:
        return None
    first: tuple[int, int] | None = None
    lo = max((t.oldest_seq for t in tracks.values() if t.seqs), default=0)  # the window every rank holds
    for t in tracks.values():
        start = bisect_left(t.seqs, lo)
        for sid in bad & t.sig_table.keys():
            try:
                seq = t.seqs[t.sig_ids.index(sid, start)]
            except ValueError:
                continue
            if first is None or seq < first[0]:
                first = (seq, sid)
    if first is None:
        return None
    seq, sid = first
    sigs = {r: sig_at(t, seq) for r, t in tracks.items()}
    culprits = tuple(sorted(r for r, sig in sigs.items() if sig is not None and broken.get(sig_id(sig))))
    sig = next(sig for r, sig in sigs.items() if r in culprits)
    waiting = tuple(sorted(r for r in tracks if r not in culprits))
    msg = (f"size_mismatch: {sig[0]} at seq {seq} of {_group_label(group)} breaks its rule: {broken[sid]} "
           f"(rank(s) {_ranks(culprits)} recorded {_short(sig)})")
    return Finding(Verdict.SIZE_MISMATCH, culprits, group, seq, sig[0], None, {r: sigs[r] for r in culprits},
                   waiting, tuple(states[r] for r in culprits if r in states), msg,
                   "medium" if not waiting else "high", _time_at(tracks, seq))


def state_mismatch(group: GroupRef, tracks: Mapping[int, GroupTrack], seq: int) -> str | None:
    """A note when ``seq`` completed on some ranks and is still pending on others."""
    done, pending = [], []
    for r, t in sorted(tracks.items()):
        i = bisect_left(t.seqs, seq)
        if i < len(t.seqs) and t.seqs[i] == seq:
            (done if t.done[i] else pending).append(r)
    if not done or not pending:
        return None
    return (f"state mismatch at seq {seq} of {_group_label(group)}: completed on rank(s) {_ranks(tuple(done))}, "
            f"still pending on rank(s) {_ranks(tuple(pending))}: look at the pending ranks (their device or stream "
            "has not run it)")


def _priority(f: Finding, stuck: set[tuple[str, str]], roots: frozenset = frozenset()) -> tuple:
    """Likely root cause first: a mismatch; then a rank that is outside every collective (or left
    no dump); then missing dumps; then ranks stuck in another collective that has its own finding
    (a consequence of that one)."""
    own = (f.group.lib, f.group.name)
    if (f.group.lib, f.group.name, f.seq) in roots:
        return (0, False, f.time_ns or float("inf"), f.group.name)  # root of a cycle, by program order
    if f.kind in (Verdict.OP_MISMATCH, Verdict.SIZE_MISMATCH, Verdict.DTYPE_MISMATCH):
        rank = 0
    elif any(c.group in stuck - {own} for c in f.culprit_states):
        rank = 4
    elif f.kind is Verdict.DUMP_MISSING and f.culprit_states and all(
            c.state in ("process_gone", "no_answer") for c in f.culprit_states):
        rank = 1  # a rank known to have died is as likely a root cause as one outside every collective
    elif f.kind is Verdict.DUMP_MISSING:
        rank = 2
    elif f.culprit_states and all(c.state == "in_collective" for c in f.culprit_states):
        rank = 3
    else:
        rank = 1
    # The earliest divergence is the root cause; for missing dumps, the group the dumped ranks
    # were in most recently is where they wait.
    when = -f.time_ns if f.kind is Verdict.DUMP_MISSING else (f.time_ns or float("inf"))
    return (rank, True, f.confidence != "high", when, f.group.name)


def analyze(loaded: LoadedFolder) -> Summary:
    """Diagnose ``loaded`` (see :func:`lightning_ncclx.analysis.analyze_folder`)."""
    traces, contexts = loaded.traces, loaded.contexts
    groups = resolve_groups(traces, contexts)
    by_lib: dict[str, dict[int, RankTrace]] = {}
    for t in traces:
        by_lib.setdefault(t.lib, {})[t.rank] = t
    seen = tuple(sorted({t.rank for t in traces}))
    world = world_size(traces, contexts)
    states = RankStates(max(world, 1), lambda r: culprit_state(r, by_lib, loaded.stacks, loaded.activities))
    for r in loaded.gone_ranks:
        if states.get(r) is not None and states[r].state == "no_dump":
            states[r] = CulpritState(r, "process_gone", "no dump: its process had exited when the dumps were "
                                     "collected (it crashed, was killed, e.g. by the OOM killer, or returned "
                                     "early)", states[r].location)
    for r, proc in loaded.silent_ranks.items():
        if states.get(r) is not None and states[r].state == "no_dump":
            states[r] = CulpritState(r, "no_answer", _silent_detail(proc), states[r].location)
    findings: list[Finding] = []
    notes: list[str] = []
    stragglers = []
    for (lib, name), group in groups.items():
        dumped = by_lib.get(lib, {})
        tracks = {r: dumped[r].groups.get(name, _EMPTY) for r in group.ranks if r in dumped}
        missing = tuple(r for r in group.ranks if r not in dumped)
        div = diverge(tracks)
        if div.unknown:
            notes.append(f"rank(s) {_ranks(div.unknown)} hold no entry of {_group_label(group)} although the others' "
                         "oldest entry of it is past its first collective: their ring buffer wrapped past it (raise "
                         "TORCH_FR_BUFFER_SIZE) or their recorder is off; they were not compared in it")
        stragglers.extend(group_stragglers(group, tracks))
        if div.kind in ("mismatch", "behind"):
            findings.append(finding_from(group, div, tracks, states))
        rule = rule_finding(group, tracks, states)
        if rule is not None and not (div.kind == "mismatch" and div.seq == rule.seq):
            findings.append(rule)
        if div.kind == "in_flight":
            odd_state = state_mismatch(group, tracks, div.seq)
            if odd_state:
                notes.append(odd_state)
        if missing:
            findings.append(_missing_finding(group, div, missing, states, tracks))
        elif div.kind == "in_flight" and group.membership_known and not div.unknown:
            notes.append(f"all {len(tracks)} dumped rank(s) of {_group_label(group)} entered "
                         f"{div.majority[0] if div.majority else '?'} (seq {div.seq}) and it has not finished: "
                         "no rank is missing from it; if this is a hang, look below the collective "
                         "(GPU kernel, network)")
            lagging = _not_started_on_device(by_lib.get(lib, {}), group, div.seq)
            if lagging:
                notes.append(lagging)
        elif div.kind == "in_flight" and div.unknown:
            compared = tuple(sorted(r for r in tracks if r not in div.unknown))
            notes.append(f"rank(s) {_ranks(compared)} are in {div.majority[0] if div.majority else '?'} "
                         f"(seq {div.seq}) of {_group_label(group)}; whether rank(s) {_ranks(div.unknown)} entered "
                         "it cannot be seen (no entry of the group in their dumps)")
        elif div.kind == "in_flight":
            notes.append(f"rank(s) {_ranks(tuple(sorted(tracks)))} are in {div.majority[0] if div.majority else '?'} "
                         f"(seq {div.seq}) of {_group_label(group)}, whose members are unknown (no pg_config in "
                         "the dumps): a member that never entered it cannot be seen here")
    findings.extend(p2p_findings(by_lib, groups, states))
    findings, roots = _with_order_deadlocks(findings, by_lib)
    stuck = {(f.group.lib, f.group.name) for f in findings}
    findings.sort(key=lambda f: _priority(f, stuck, roots))
    missing_ranks = tuple(r for r in range(world) if r not in seen)
    if not traces:
        notes.insert(0, "no readable flight-recorder dump found")
    notes.extend(loaded.warnings)
    head = findings[0] if findings else None
    return Summary(
        source=loaded.root, verdict=head.kind if head else Verdict.NO_HANG,
        culprit_ranks=head.ranks if head else (), process_group=head.group if head else None,
        collective_seq_id=head.seq if head else None, op=head.op if head else None,
        waiting_ranks=head.waiting_ranks if head else (), findings=tuple(findings), notes=tuple(notes),
        unreadable=loaded.unreadable, ranks_seen=seen, ranks_missing=missing_ranks,
        hosts={r: c.host for r, c in contexts.items() if c.host}, dump_locations=loaded.dump_locations,
        stragglers=tuple(sorted(stragglers, key=lambda s: -s.median_late_ms)[:10]),
        per_rank=rank_rows(seen, missing_ranks, by_lib, states, contexts,
                           keep=tuple(r for f in findings for r in f.ranks)),
        context=_context_extras(loaded, world),
        inputs=tuple(InputFile(t.path, t.rank, t.rank_from, t.lib, t.fmt, t.version, t.comm_lib_version, t.n_entries)
                     for t in traces),
        ignored=loaded.ignored, duplicates=loaded.duplicates,
    )


def _not_started_on_device(dumped: Mapping[int, RankTrace], group: GroupRef, seq: int) -> str | None:
    """When every rank entered ``seq`` but only some have it ``started`` (NCCL with timing: the
    kernel began), the ranks where it is still ``scheduled`` have a stream busy with earlier work."""
    states: dict[int, str] = {}
    for r in group.ranks:
        trace = dumped.get(r)
        op = next((o for o in trace.open_ops if o.group == group.name and not o.is_p2p and o.seq == seq),
                  None) if trace is not None else None
        if op is not None:
            states[r] = op.state
    scheduled = tuple(sorted(r for r, st in states.items() if st == "scheduled"))
    started = tuple(sorted(r for r, st in states.items() if st == "started"))
    if not scheduled or not started:
        return None
    return (f"in seq {seq} of {_group_label(group)}, rank(s) {_ranks(scheduled)} enqueued the collective but their "
            f"GPU had not started it while rank(s) {_ranks(started)} had: the stream of rank(s) "
            f"{_ranks(scheduled)} is still busy with earlier work (a slow or hung kernel, or a wait on another stream)")


_STATE_MEANING = {
    "T": "stopped (SIGSTOP, or a debugger attached)",
    "t": "stopped by a debugger",
    "D": "in uninterruptible sleep (D: waiting on a hung filesystem or device)",
}


_ALIVE = "no dump, but its process was alive: "


def _silent_detail(proc: Mapping) -> str:
    state = str(proc.get("state") or "?")
    where = f"pid {proc.get('pid')} on {proc.get('host') or '?'}"
    meaning = _STATE_MEANING.get(state, "running or sleeping, yet its watchdog thread could not run: the main "
                                        "thread most likely holds the GIL in native code")
    return f"{_ALIVE}{where}, state {state}: {meaning}; `py-spy dump --native --pid {proc.get('pid')}` on that " \
           "host shows where"


def _with_order_deadlocks(findings: list[Finding], by_lib: Mapping[str, Mapping[int, RankTrace]]
                          ) -> tuple[list[Finding], frozenset]:
    """Add evidence where two groups wait on each other: the culprits of one group's finding
    are inside another group's collective, whose own culprits are waiting in the first. Each
    side alone reads "not entered"; together they are a call-order deadlock. Which side is the
    root cause is decided by program order (:mod:`order`), never by the size of either group's
    majority: returns the findings and the (backend, group, seq) keys of the roots."""
    not_entered = {(f.group.lib, f.group.name): f for f in findings if f.kind is Verdict.NOT_ENTERED}
    out = []
    roots: set[tuple[str, str, int]] = set()
    for f in findings:
        own = (f.group.lib, f.group.name)
        for c in f.culprit_states:
            other = not_entered.get(c.group) if c.state == "in_collective" and c.group != own else None
            if other is None or not set(other.ranks) & set(f.waiting_ranks):
                continue
            cycle = (f"deadlock across groups: rank(s) {_ranks(f.ranks)} wait in {other.op} of group "
                     f"{other.group.name} for rank(s) {_ranks(other.ranks)}, which wait in {f.op} of group "
                     f"{f.group.name} for them: rank(s) {_ranks(f.ranks)} skipped that {f.op} or call the two "
                     "groups in a different order")
            root = _cycle_root(f, other, by_lib.get(f.group.lib, {}))
            if root is not None:
                winner, why = root
                roots.add((winner.group.lib, winner.group.name, winner.seq))
                if winner is f:
                    f = replace(f, message=f"{f.message}. {why}")
            f = replace(f, evidence=(cycle,) + f.evidence)
            break
        out.append(f)
    return out, frozenset(roots)


def _cycle_root(a: Finding, b: Finding, traces: Mapping[int, RankTrace]) -> tuple[Finding, str] | None:
    """Of two findings waiting on each other, the one whose culprits left their own call pattern
    (the others kept theirs); else the one whose culprits went elsewhere first."""
    departures = {}
    for f in (a, b):
        found = [(r, departs_from_own_order(traces[r])) for r in f.ranks if r in traces]
        departures[id(f)] = [(r, d) for r, d in found if d is not None]
    left = [f for f in (a, b) if departures[id(f)]]
    if len(left) == 1:
        root = left[0]
        other = b if root is a else a
        rank, (expected, called, _, _) = departures[id(root)][0]
        why = (f"why rank {rank}: it skipped {root.op} #{root.seq} of group {root.group.name} and went on to "
               f"{called[1]} of group {called[0]} (its earlier steps call {expected[1]} of group {expected[0]} "
               f"there), while rank(s) {_ranks(other.ranks)} kept their order; rank(s) "
               f"{_ranks(root.waiting_ranks)} wait in group {root.group.name} for it")
        return root, why
    return _by_peers_next_call(a, b, traces)


def _by_peers_next_call(a: Finding, b: Finding, traces: Mapping[int, RankTrace]) -> tuple[Finding, str] | None:
    """The ranks that belong to both groups share a role: the group most of them went to last is
    the common order; the finding whose culprits went to the other group is the root."""
    both = set(a.group.ranks) & set(b.group.ranks) & set(traces)
    went: dict[int, str] = {}
    for r in both:
        calls = program(traces[r])
        if calls:
            went[r] = calls[-1][1]
    counts = Counter(went.values()).most_common()
    if len(counts) < 2 or counts[0][1] == counts[1][1]:
        return None
    common = counts[0][0]
    for root, other in ((a, b), (b, a)):
        if root.ranks and all(went.get(r) == other.group.name for r in root.ranks) and root.group.name == common:
            peers = tuple(sorted(r for r, g in went.items() if g == common))
            return root, (f"why rank(s) {_ranks(root.ranks)}: they went to {other.op} of group {other.group.name} "
                          f"where rank(s) {_ranks(peers)}, members of both groups, went on to {root.op} "
                          f"#{root.seq} of group {root.group.name}; rank(s) {_ranks(root.waiting_ranks)} wait there "
                          "for them")
    return None


_EMPTY = GroupTrack("", "", "", array("q"), array("q"), {}, b"", array("q"))


def _missing_finding(group: GroupRef, div: Divergence, missing: tuple[int, ...],
                     states: Mapping[int, CulpritState], tracks: Mapping[int, GroupTrack]) -> Finding:
    op = div.majority[0] if div.majority else "?"
    if not div.time_ns:  # healthy: the time of the dumped ranks' newest collective in this group
        div = replace(div, time_ns=max((t.times_ns[-1] for t in tracks.values() if t.seqs), default=0))
    known = {r: states[r].state for r in missing if states.get(r) is not None}
    if missing and all(known.get(r) in ("process_gone", "no_answer") for r in missing):
        where = f"the dumped ranks are in {op} (seq {div.seq})" if div.kind != "healthy" else (
            f"the dumped ranks agree with each other (last: {op}, seq {div.seq})")
        gone = tuple(r for r in missing if known[r] == "process_gone")
        silent = tuple(r for r in missing if known[r] == "no_answer")
        parts = []
        if gone:
            parts.append(f"the process of rank(s) {_ranks(gone)} had exited when the dumps were collected "
                         "(it crashed, was killed, e.g. by the OOM killer, or returned early; its log and the "
                         "kernel log say why)")
        if silent:
            parts.append(f"rank(s) {_ranks(silent)} did not dump although alive (rank {silent[0]}: "
                         f"{states[silent[0]].detail.removeprefix(_ALIVE)})")
        msg = f"dump_missing: in {_group_label(group)}, " + "; ".join(parts) + f"; {where}"
        waiting = tuple(r for r in group.ranks if r not in missing)
        return Finding(Verdict.DUMP_MISSING, missing, group, div.seq, op, div.majority, {r: None for r in missing},
                       waiting, tuple(states[r] for r in missing), msg, "high", div.time_ns)
    if div.kind == "healthy":
        msg = (f"dump_missing: rank(s) {_ranks(missing)} of {_group_label(group)} left no dump, and the dumped "
               f"ranks agree with each other (last: {op}, seq {div.seq}): the missing ranks died, were killed or "
               "could not be reached; their host's logs say why")
    else:
        msg = (f"dump_missing: rank(s) {_ranks(missing)} of {_group_label(group)} left no dump; the dumped ranks "
               f"are in {op} (seq {div.seq}): a rank that never entered a collective may never dump (nccl2)")
    waiting = tuple(r for r in group.ranks if r not in missing)
    return Finding(Verdict.DUMP_MISSING, missing, group, div.seq, op, div.majority, {r: None for r in missing},
                   waiting, tuple(states[r] for r in missing if r in states), msg, "medium", div.time_ns)


def _context_extras(loaded: LoadedFolder, world: int) -> dict:
    out: dict = {"world_size": world}
    ctx = next(iter(loaded.contexts.values()), None)
    if ctx is not None:
        out.update({"event": ctx.event, "reason": ctx.reason, "initiator_rank": ctx.initiator_rank})
        out["phase_by_rank"] = {str(r): c.phase for r, c in sorted(loaded.contexts.items()) if c.phase}
        out["step_by_rank"] = {str(r): c.step for r, c in sorted(loaded.contexts.items()) if c.step is not None}
        exc = {str(r): c.exception for r, c in sorted(loaded.contexts.items()) if c.exception}
        if exc:
            out["exceptions"] = exc
    out["backends"] = sorted({t.lib for t in loaded.traces})
    out["versions"] = sorted({t.version for t in loaded.traces})
    return out
