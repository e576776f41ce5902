"""From loaded dumps to a :class:`Summary`: per group divergence -> findings -> verdict. Pure."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import replace
from typing import Any, Mapping

from lightning_ncclx.analysis.align import Divergence, callsite_divergence, diverge, sig_at, time_at
from lightning_ncclx.analysis.cycles import with_order_deadlocks
from lightning_ncclx.analysis.op_rules import rule_finding
from lightning_ncclx.analysis.wording import group_label as _group_label
from lightning_ncclx.analysis.wording import ranks_text as _ranks
from lightning_ncclx.analysis.wording import short as _short
from lightning_ncclx.analysis.groups import resolve_groups, world_size
from lightning_ncclx.analysis.kind import classify, confirmed_stall, exit_description
from lightning_ncclx.analysis.model import (CulpritState, Finding, GroupRef, GroupTrack, InputFile, LoadedFolder, RankAtDump,
                                            RankTrace, Sig, Summary, Verdict)
from lightning_ncclx.analysis.order import extra_or_skipped, own_order, skipped_into_next
from lightning_ncclx.analysis.p2p import p2p_findings, with_context_p2p
from lightning_ncclx.analysis.ranks import RankStates, culprit_state, listed, rank_rows
from lightning_ncclx.analysis.raised import raised_first
from lightning_ncclx.analysis.skew import group_stragglers
from lightning_ncclx.analysis.wait_chains import p2p_key, with_wait_chains


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


def _by_own_period(div: Divergence, tracks: Mapping[int, GroupTrack]) -> tuple[Divergence, str, str | None] | None:
    """A tie (no majority) settled by program order: the one rank whose call at ``div.seq`` leaves
    its own order in the group (the period of its earlier calls, or where the history repeats no
    strict period, what followed its previous call every time before), while every other rank's
    call is the one its own order expected. (divergence, why, program-order evidence when the
    culprit called from another call site than its order expected: it skipped or added a call)."""
    verdicts = {r: own_order(tracks[r], div.seq) for r in div.culprits if r in tracks}
    breakers = [r for r, v in verdicts.items() if v is not None and v[0]]
    if len(breakers) != 1:
        return None
    culprit = breakers[0]
    others = tuple(r for r in div.culprits if r != culprit)
    if not others or not all(verdicts.get(r) is not None and not verdicts[r][0] for r in others):
        return None
    expected = verdicts[culprit][1]
    majority = div.sigs.get(others[0])
    steps = tracks[culprit]
    called_site = _site_of(steps, div.seq)
    if expected is not None:
        there = f"there it called {_short(steps.sig_table.get(expected[0]))} from {expected[1] or 'the same call site'}"
    else:
        there = f"its call from {called_site or 'an unknown call site'} never followed its previous call before"
    why = (f"no majority, but rank {culprit} broke the pattern of its own earlier steps ({there}) while rank(s) "
           f"{_ranks(others)} kept theirs")
    evidence = None
    if expected is None or (expected[1] and called_site and expected[1] != called_site):
        evidence = (f"program order: rank {culprit} called {_short(div.sigs.get(culprit))} at seq {div.seq} from "
                    f"{called_site or 'an unknown call site'}, where its own earlier steps called "
                    + (f"{_short(steps.sig_table.get(expected[0]))} from {expected[1]}" if expected is not None
                       else "something else")
                    + ": it skipped or added a collective")
    return replace(div, majority=majority, culprits=(culprit,), waiting=others, confidence="medium"), why, evidence


def _site_of(track: GroupTrack, seq: int) -> str | None:
    i = bisect_left(track.seqs, seq)
    return track.callsite(i) if i < len(track.seqs) and track.seqs[i] == seq else None


def finding_from(group: GroupRef, div: Divergence, tracks: Mapping[int, GroupTrack],
                 states: Mapping[int, CulpritState]) -> Finding:
    why = order_evidence = None
    if div.kind == "mismatch" and div.majority is None:
        settled = _by_own_period(div, tracks)
        if settled is not None:
            div, why, order_evidence = settled
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
            skip = None if why else skipped_into_next(tracks, div.culprits, div.waiting, div.seq)
            if skip is not None:  # its next call, paired with the one it skipped: not an argument mismatch
                (_, skipped_site), (_, made_site) = skip
                kind = Verdict.NOT_ENTERED
                msg = (f"not_entered: rank(s) {_ranks(div.culprits)} skipped {_short(div.majority)} (seq {div.seq}) "
                       f"of {_group_label(group)} and called {theirs} there, the call their own earlier steps make "
                       f"right after it; rank(s) {_ranks(div.waiting)} are waiting in it")
                order_evidence = (f"program order: rank(s) {_ranks(div.culprits)} called {theirs} at seq {div.seq} "
                                  f"from {made_site or 'an unknown call site'}, which their earlier steps call after "
                                  f"{_short(div.majority)} from {skipped_site or 'an unknown call site'}: they "
                                  "skipped it")
    else:
        kind = Verdict.NOT_ENTERED
        msg = (f"not_entered: rank(s) {_ranks(div.culprits)} never entered {op} (seq {div.seq}) of "
               f"{_group_label(group)}; rank(s) {_ranks(div.waiting)} are waiting in it")
        departure = extra_or_skipped(tracks, div.culprits, div.waiting, div.seq - 1) if (
            len(div.culprits) >= len(div.waiting)) else None
        if departure is not None and departure[0] == "extra":
            return _extra_finding(group, div, tracks, states, *departure[1:])
        if departure is not None:
            div = replace(div, confidence="high")
            msg += f": {departure[2]} (at seq {departure[1]})"
    evidence = [order_evidence] if order_evidence else []
    cs = callsite_divergence(tracks) if div.kind in ("mismatch", "behind") else None
    if cs is not None:
        seq, sites = cs
        evidence.append(f"call sites first differ at seq {seq}: " + "; ".join(
            f"rank {r}: {s or '?'}" for r, s in sorted(sites.items())))
    culprit_states = tuple(states[r] for r in div.culprits if r in states)
    observed = {r: div.sigs.get(r) for r in div.culprits}
    return Finding(kind, div.culprits, group, div.seq, op, div.majority, observed, div.waiting, culprit_states,
                   msg, div.confidence, div.time_ns, tuple(evidence))


def _extra_finding(group: GroupRef, div: Divergence, tracks: Mapping[int, GroupTrack],
                   states: Mapping[int, CulpritState], seq: int, why: str, confidence: str) -> Finding:
    """The ranks ahead (``div.waiting``) called a collective at ``seq`` that the others never
    called: gloo and NCCL paired it with the others' next call, so the ranks ahead have run one
    call ahead since, and now wait in ``div.seq`` which the others will not enter."""
    extra, left = div.waiting, div.culprits
    sig = next((s for r in extra if (s := sig_at(tracks[r], seq)) is not None), None)
    waits_in = div.sigs.get(extra[0])
    msg = (f"extra_collective: rank(s) {_ranks(extra)} called a collective the others did not, "
           f"{_short(sig)} at seq {seq} of {_group_label(group)}: {why}. Since then each of their calls "
           f"was matched with the others' next one; rank(s) {_ranks(extra)} now wait in {_short(waits_in)} "
           f"(seq {div.seq}) which rank(s) {_ranks(left)}, done with seq {div.seq - 1}, never enter")
    evidence = []
    cs = callsite_divergence(tracks)
    if cs is not None:
        evidence.append(f"call sites first differ at seq {cs[0]}: " + "; ".join(
            f"rank {r}: {s or '?'}" for r, s in sorted(cs[1].items())))
    culprit_states = tuple(states[r] for r in extra if r in states)
    return Finding(Verdict.EXTRA_COLLECTIVE, extra, group, seq, (sig or ("?",))[0], waits_in,
                   {r: sig for r in extra}, left, culprit_states, msg, confidence, time_at(tracks, seq), tuple(evidence))


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
    if f.kind in (Verdict.OP_MISMATCH, Verdict.SIZE_MISMATCH, Verdict.DTYPE_MISMATCH, Verdict.EXTRA_COLLECTIVE):
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


def analyze(loaded: LoadedFolder, for_reports: bool = True) -> Summary:
    """Diagnose ``loaded`` (see :func:`lightning_ncclx.analysis.analyze_folder`). ``for_reports``
    False: no per-rank rows and no straggler statistics, which only the reports show (a diagnosis
    read for its findings alone: a two-phase gather's first one, which picks the full dumps to
    pull; at 16,384 ranks the two are most of the analysis)."""
    contexts = loaded.contexts
    traces = with_context_p2p(loaded.traces, contexts)  # gloo's sends/recvs, which its recorder omits
    groups = resolve_groups(traces, contexts)
    by_lib: dict[str, dict[int, RankTrace]] = {}
    for t in traces:
        by_lib.setdefault(t.lib, {})[t.rank] = t
    seen = tuple(sorted({t.rank for t in traces}))
    world = world_size(traces, contexts)
    states = RankStates(max(world, 1), lambda r: culprit_state(r, by_lib, loaded.stacks, loaded.activities))
    for r in loaded.gone_ranks:
        if states.get(r) is not None and states[r].state == "no_dump":
            states[r] = CulpritState(r, "process_gone", _gone_detail(loaded.gone_exits.get(r)), states[r].location)
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
        if for_reports:
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
    p2p = p2p_findings(by_lib, groups, states)
    findings.extend(p2p)
    findings, roots = with_order_deadlocks(findings, by_lib)
    stuck = {(f.group.lib, f.group.name) for f in findings}
    findings.sort(key=lambda f: _priority(f, stuck, roots))
    findings = with_wait_chains(findings, map(p2p_key, p2p), states)
    findings = raised_first(findings, {r: c.exception for r, c in contexts.items() if c.exception})
    seen_set = set(seen)
    missing_ranks = tuple(r for r in range(world) if r not in seen_set)
    if not traces:
        notes.insert(0, "no readable flight-recorder dump found")
    notes.extend(loaded.warnings)
    notes.extend(f"left out by the watchdog: {line}" for line in loaded.refused)
    if loaded.digest_only_ranks:
        full = sorted(set(seen) - set(loaded.digest_only_ranks))
        notes.append(f"full dumps of rank(s) {_ranks(tuple(full))}; digests only of rank(s) "
                     f"{_ranks(loaded.digest_only_ranks)} (their newest collectives of each group: their full dumps "
                     "stay on their hosts)")
    head = findings[0] if findings else None
    # no rank waits for another, and yet a rank raised: the exception is the event's cause (its
    # peers had not reached the collective it left when they dumped)
    raised = tuple(sorted(r for r, c in contexts.items() if c.exception))
    summary = Summary(
        source=loaded.root, verdict=head.kind if head else Verdict.NO_HANG,
        culprit_ranks=head.ranks if head else raised, process_group=head.group if head else None,
        collective_seq_id=head.seq if head else None, op=head.op if head else None,
        waiting_ranks=head.waiting_ranks if head else (), findings=tuple(findings), notes=tuple(notes),
        unreadable=loaded.unreadable, ranks_seen=seen, ranks_missing=missing_ranks,
        hosts={r: c.host for r, c in contexts.items() if c.host}, dump_locations=loaded.dump_locations,
        stragglers=tuple(sorted(stragglers, key=lambda s: -s.median_late_ms)[:10]),
        per_rank=rank_rows(seen, missing_ranks, by_lib, states, contexts,
                           keep=tuple(r for f in findings for r in f.ranks)) if for_reports else (),
        context=_context_extras(loaded, world),
        inputs=tuple(InputFile(t.path, t.rank, t.rank_from, t.lib, t.fmt, t.version, t.comm_lib_version, t.n_entries)
                     for t in traces),
        ignored=loaded.ignored, duplicates=loaded.duplicates, recovery=loaded.recovery,
        at_dump=_at_dump(loaded, by_lib, seen) if not findings else {},
    )
    classification = classify(summary)
    if head is None and classification.kind.value in _EVERY_RANK_STALLED and confirmed_stall(summary):
        return replace(summary, classification=classification, verdict=Verdict.STALLED)
    return replace(summary, classification=classification)


_EVERY_RANK_STALLED = frozenset({"collective_stalled", "program_stalled"})


def _at_dump(loaded: LoadedFolder, by_lib: Mapping[str, Mapping[int, RankTrace]],
             seen: tuple[int, ...]) -> dict[int, RankAtDump]:
    """Each dumped rank when it dumped (only needed when no finding names a rank)."""
    out = {}
    for r in seen:
        ctx = loaded.contexts.get(r)
        out[r] = RankAtDump(loaded.stacks.get(r), loaded.activities.get(r),
                            ctx.seconds_since_heartbeat if ctx else None, ctx.time_unix if ctx else None,
                            _open_op_completed(r, by_lib), ctx.stall_threshold_seconds if ctx else None)
    return out


def _open_op_completed(rank: int, by_lib: Mapping[str, Mapping[int, RankTrace]]) -> bool | None:
    """Whether torch's watchdog saw the group of the rank's oldest unfinished op complete every op
    enqueued on it (``pg_status``): True, False, or None where it keeps no count."""
    traces = [t[rank] for t in by_lib.values() if rank in t]
    open_ops = sorted((o for t in traces for o in t.open_ops), key=lambda o: o.time_ns)
    if not open_ops:
        return None
    oldest = open_ops[0]
    trace = next(t for t in traces if oldest in t.open_ops)
    enqueued, completed = trace.pg_status.get(oldest.group, (-1, -1))
    if enqueued < 0 or completed < 0:
        return None
    return completed >= enqueued


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


_EMPTY = GroupTrack("", "", "", array("q"), array("q"), {}, b"", array("q"))


def _missing_finding(group: GroupRef, div: Divergence, missing: tuple[int, ...],
                     states: Mapping[int, CulpritState], tracks: Mapping[int, GroupTrack]) -> Finding:
    op = div.majority[0] if div.majority else "?"
    absent = frozenset(missing)  # a 100,000-rank group with 3 dumps: membership tests must not scan a tuple
    if not div.time_ns:  # healthy: the time of the dumped ranks' newest collective in this group
        div = replace(div, time_ns=max((t.times_ns[-1] for t in tracks.values() if t.seqs), default=0))
    lost = ("process_gone", "no_answer")  # stops at the first rank that is not: no state per rank of a huge group
    if missing and all(states.get(r) is not None and states[r].state in lost for r in missing):
        known = {r: states[r].state for r in missing}
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
        waiting = tuple(r for r in group.ranks if r not in absent)
        return Finding(Verdict.DUMP_MISSING, missing, group, div.seq, op, div.majority,
                       {r: None for r in listed(missing)}, waiting, tuple(states[r] for r in listed(missing)), msg,
                       "high", div.time_ns)
    if div.kind == "healthy":
        msg = (f"dump_missing: rank(s) {_ranks(missing)} of {_group_label(group)} left no dump, and the dumped "
               f"ranks agree with each other (last: {op}, seq {div.seq}): the missing ranks died, were killed or "
               "could not be reached; their host's logs say why")
    else:
        msg = (f"dump_missing: rank(s) {_ranks(missing)} of {_group_label(group)} left no dump; the dumped ranks "
               f"are in {op} (seq {div.seq}): a rank that never entered a collective may never dump (nccl2)")
    waiting = tuple(r for r in group.ranks if r not in absent)
    return Finding(Verdict.DUMP_MISSING, missing, group, div.seq, op, div.majority, {r: None for r in listed(missing)},
                   waiting, tuple(states[r] for r in listed(missing) if r in states), msg, "medium", div.time_ns)


def _gone_detail(exit_: Any) -> str:
    """``process_gone``'s detail: how the process ended when the watchdog could know it."""
    how = exit_description(exit_)
    if how:
        return f"no dump: its process had {how} before the dumps were collected"
    return ("no dump: its process had exited when the dumps were collected (it crashed, was killed, e.g. by the "
            "OOM killer, or returned early; how it ended is not known)")


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
    if loaded.gone_exits:
        out["rank_exits"] = {str(r): dict(e) for r, e in sorted(loaded.gone_exits.items())}
    out["backends"] = sorted({t.lib for t in loaded.traces})
    out["versions"] = sorted({t.version for t in loaded.traces})
    return out
