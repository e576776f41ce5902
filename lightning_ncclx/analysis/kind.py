"""What kind of hang a :class:`Summary` shows, what to look at next, and whether a restart helps.

Pure functions of the summary (which already carries what the watchdog learnt when collecting:
ranks whose process had exited, ranks alive but silent). The kinds follow the split a person on
call has to make: the program's code (fix it; a restart hangs again), a sick host (restart without it), or
the layer below the collective (collect NCCL's own evidence).

Example::

    verdict = classify(analyze_folder("ncclx_dumps/stall-001"))
    print(verdict.kind.value, verdict.reason, verdict.restart.value, verdict.hosts_to_exclude)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from lightning_ncclx.analysis.model import CulpritState, Finding, RankRow, Summary, Verdict
from lightning_ncclx.analysis.wording import UNNAMED_DESCS, group_title


class HangKind(str, Enum):
    program_divergence = "program_divergence"
    """A rank took another path: it never entered, skipped or added a collective, or called groups
    in another order."""
    argument_mismatch = "argument_mismatch"
    """Every rank called the collective, with a different op, size or dtype."""
    stuck_outside_collective = "stuck_outside_collective"
    """A rank is alive but in the data loader, file IO, a checkpoint, a lock or user code."""
    rank_lost = "rank_lost"
    """A rank's process is gone (crash, OOM kill, node loss)."""
    collective_stalled = "collective_stalled"
    """Every rank entered the same collective and it never completed: GPU kernel, network, NCCL."""
    program_stalled = "program_stalled"
    """A confirmed stall in which no rank waits in a collective: every rank stopped in the program
    (its own code, a lock, the data loader, file IO), so no rank is missing from a collective."""
    teardown = "teardown"
    """Training had ended: a rank hangs while the job shuts down."""
    unknown = "unknown"
    no_hang = "no_hang"

    def __str__(self) -> str:
        return self.value


class RestartAction(str, Enum):
    restart = "restart"
    restart_excluding_hosts = "restart_excluding_hosts"
    do_not_restart = "do_not_restart"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Classification:
    """The hang kind with its one-sentence reason, next steps, and the restart decision."""

    kind: HangKind
    reason: str
    advice: tuple[str, ...]
    restart: RestartAction
    restart_reason: str
    hosts_to_exclude: tuple[str, ...] = ()

    def restart_advice(self) -> dict[str, Any]:
        return {"action": self.restart.value, "reason": self.restart_reason,
                "hosts_to_exclude": list(self.hosts_to_exclude)}


_PROGRAM = (RestartAction.do_not_restart, "a restart runs the same code and hangs again: fix the program first")
_ALIVE_PREFIX = "no dump, but its process was alive"


def classify(summary: Summary) -> Classification:
    """The :class:`Classification` of ``summary`` (see the module docstring). Never raises: the
    reports must still be written when the evidence is odd."""
    try:
        return _classify(summary)
    except Exception as exc:  # noqa: BLE001
        return Classification(HangKind.unknown, f"the hang could not be classified ({type(exc).__name__}: {exc})",
                              ("read the findings below",), RestartAction.restart,
                              "nothing points at the program; a restart is the cheap test")


def _classify(summary: Summary) -> Classification:
    head = summary.findings[0] if summary.findings else None
    if head is None:
        return _without_finding(summary)
    raised = {r: e for r, e in (summary.context.get("exceptions") or {}).items()
              if str(r).isdigit() and int(r) in head.ranks and e}
    if raised and head.kind in _MISMATCHES and all(_lost_its_peer(e) for e in raised.values()):
        return _mismatch_that_aborted(summary, head, raised)
    if raised:
        return _raised(summary, head, raised)
    if _in_teardown(summary, head):
        reason = f"training had ended (phase idle) when rank(s) {_r(head.ranks)} stopped: {head.message}"
        advice = (("the job hangs while shutting down: look for a collective or barrier after trainer.fit "
                   "(destroy_process_group, a final checkpoint or metric sync) that not every rank reaches"),
                  "the run's checkpoints are complete; check the last one")
        return Classification(HangKind.teardown, reason, advice, RestartAction.do_not_restart,
                              "training had finished: restarting would redo work already done")
    if head.kind in (Verdict.SIZE_MISMATCH, Verdict.DTYPE_MISMATCH, Verdict.OP_MISMATCH):
        return _with_aborted_peers(summary, head, _mismatch(summary, head))
    if head.kind is Verdict.NOT_ENTERED:
        return _not_entered(summary, head)
    if head.kind is Verdict.EXTRA_COLLECTIVE:
        return _extra(summary, head)
    return _missing(summary, head)


# ------------------------------------------------------------------------------------ kinds
def _mismatch(summary: Summary, head: Finding) -> Classification:
    order = next((e for e in head.evidence if e.startswith("program order: ")), None)
    if order is not None:  # no majority; program order says the culprit called from another place
        return _diverged(summary, head, f"{order.removeprefix('program order: ')} (seq {head.seq} of group "
                         f"{_group_name(head)}; the sizes differ because the calls differ)")
    what = {Verdict.OP_MISMATCH: "op", Verdict.SIZE_MISMATCH: "size", Verdict.DTYPE_MISMATCH: "dtype"}[head.kind]
    theirs = _site(summary, head.ranks)
    others = _site(summary, head.waiting_ranks)
    sites = next((e for e in head.evidence if e.startswith("call sites first differ")), None)
    inside = all(c.state == "in_collective" for c in head.culprit_states) and head.culprit_states
    if sites is None and not inside and not others.startswith("an unknown"):
        # The recorder kept call sites and none differ: the culprit called it where the others did.
        theirs = f"the same call site, {others} (it is now at {theirs})"
    advice = [f"rank(s) {_r(head.ranks)} called it at {theirs}",
              f"rank(s) {_r(head.waiting_ranks)} called it at {others}",
              *([sites] if sites else []),
              (f"make the {what} the same on every rank (look for a rank-dependent shape, a batch that is not "
               "padded, or a dtype cast on one path)")]
    return Classification(
        HangKind.argument_mismatch, f"the ranks called {head.op} (seq {head.seq}) with a different {what}: "
        f"{head.message.split(': ', 1)[-1]}", tuple(advice), *_PROGRAM)


def _not_entered(summary: Summary, head: Finding) -> Classification:
    states = head.culprit_states
    if states and all(c.state == "outside_collective" for c in states):
        activity = next((_activity(c) for c in states if _activity(c)), None)
        if activity is not None:
            return _stuck(summary, head, activity)
        if any(e.startswith("call sites first differ") for e in head.evidence):
            return _diverged(summary, head, f"it recorded other collectives than the others and is now outside "
                             f"every collective while they wait in {head.op} (seq {head.seq}): it skipped it")
        return _stuck(summary, head, f"in its own code at {_site(summary, head.ranks)}")
    if states and all(c.state in ("process_gone",) for c in states):
        return _lost(summary, head)
    if states and any(c.state == "in_collective" for c in states):
        inside = next(c for c in states if c.state == "in_collective")
        where = _named(summary, inside.detail.removeprefix("in "))
        if head.op in ("send", "recv"):
            return _diverged(summary, head, f"{where}, while rank(s) {_r(head.waiting_ranks)} wait in {head.op} "
                             f"(p2p {head.seq}) of group {_group_name(head)} for it: it skipped, reordered or "
                             f"misaddressed the {'recv' if head.op == 'send' else 'send'} they wait for")
        return _diverged(summary, head, f"{where}, while the others wait in {head.op} "
                         f"(seq {head.seq}) of group {_group_name(head)}: it skipped, added or reordered a collective")
    return _diverged(summary, head, f"never entered {head.op} (seq {head.seq}) of group {_group_name(head)}")


def _diverged(summary: Summary, head: Finding, what: str) -> Classification:
    culprit = head.ranks[0] if head.ranks else None
    site = _site(summary, head.ranks)
    waiting_site = _site(summary, head.waiting_ranks)
    advice = ((f"inspect the code of rank {culprit} at {site}: the branch or loop that lets this rank take another "
               "path (a rank-dependent condition, early return, uneven data, an exception swallowed on one rank)"),
              f"the waiting rank(s) {_r(head.waiting_ranks)} are in {head.op} called at {waiting_site}")
    evidence = next((e for e in head.evidence if e.startswith(("call sites", "deadlock"))), None)
    if evidence:
        advice += (evidence,)
    return Classification(HangKind.program_divergence, f"rank(s) {_r(head.ranks)} took another path: {what}",
                          advice, *_PROGRAM)


def _extra(summary: Summary, head: Finding) -> Classification:
    sites = next((e for e in head.evidence if e.startswith("call sites")), None)
    advice = ((f"inspect the code of rank(s) {_r(head.ranks)} where it called {head.op} (seq {head.seq}): a "
               "collective only these ranks run (a rank-dependent condition, one more batch than the others from "
               "uneven data, a retry, a metric synced on one rank)"),
              *([sites] if sites else []),
              (f"rank(s) {_r(head.waiting_ranks)} finished the collectives they called and are elsewhere; with uneven "
               "data per rank use a DistributedSampler, drop_last or the same number of batches on every rank"))
    return Classification(HangKind.program_divergence,
                          f"rank(s) {_r(head.ranks)} took another path: they called {head.op} (seq {head.seq}) of "
                          f"group {_group_name(head)}, a collective the others did not call, and now wait in a call "
                          f"rank(s) {_r(head.waiting_ranks)} never make", advice, *_PROGRAM)


_WHERE_ADVICE = (
    ("in its own code", ("the rank's own code there: a loop, sleep or wait that does not end on this rank; "
                         "`py-spy dump --pid` on its host shows the whole stack")),
    ("data loader", ("the data loader: look at its worker processes (`py-spy dump --pid` on them), the storage the "
                     "dataset reads from, and give DataLoader a timeout= so a dead worker raises")),
    ("checkpoint", ("checkpoint IO: check the filesystem the checkpoint is written to (free space, `dmesg` for "
                    "NFS/Lustre errors) and whether every rank reaches the save")),
    ("uninterruptible", ("the filesystem or a device: the process is in D state; `dmesg -T` on its host shows "
                         "the hung mount or device")),
    ("lock", "a lock, event or thread join: `py-spy dump --pid` shows which thread holds it"),
    ("queue", "a queue: `py-spy dump --pid` shows which thread should feed it"),
    ("GPU", "the GPU: a kernel that does not finish; `nvidia-smi` and `dmesg -T | grep -i xid` on its host"),
    ("GIL", "native code holding the GIL: `py-spy dump --native --pid` on its host shows where"),
    ("stopped", "a stopped process (SIGSTOP or a debugger): resume or kill it"),
)


def _stuck(summary: Summary, head: Finding, activity: str) -> Classification:
    culprit = head.ranks[0]
    where = _where_advice(activity)
    host = summary.hosts.get(culprit)
    advice = (f"rank {culprit}{' on ' + host if host else ''} is {activity}", f"look at {where}")
    sick_host = "uninterruptible" in activity and host
    sick_host = sick_host and len(set(summary.hosts.values())) > 1
    reason = (f"rank(s) {_r(head.ranks)} are alive but outside every collective, {activity}, while the others "
              f"wait in {head.op} (seq {head.seq})")
    if sick_host:
        return Classification(HangKind.stuck_outside_collective, reason, advice,
                              RestartAction.restart_excluding_hosts, "the host's filesystem or device is hung",
                              (str(host),))
    return Classification(HangKind.stuck_outside_collective, reason, advice, RestartAction.restart,
                          "a stuck loader, IO or lock is often transient; if the same rank sticks again after a "
                          "restart, it is the program")


def _lost(summary: Summary, head: Finding) -> Classification:
    hosts = tuple(sorted({summary.hosts[r] for r in head.ranks if r in summary.hosts}))
    on = f" on {', '.join(hosts)}" if hosts else ""
    advice = (f"the log of rank(s) {_r(head.ranks)}: its last lines before it exited",
              f"the kernel log{on}: `dmesg -T | grep -i -e oom -e killed -e xid` (OOM killer, GPU errors)",
              "the scheduler's record of the job (`sacct -j $SLURM_JOB_ID --format=JobID,State,ExitCode,NodeList`)")
    aborted = _aborted(summary, head.ranks)
    if head.group.lib == "gloo" and aborted and _others_in_a_collective(summary, head):
        return _aborted_in_a_collective(summary, head, aborted)
    if head.group.lib == "gloo" and _others_in_a_collective(summary, head):
        return Classification(
            HangKind.rank_lost, f"the process of rank(s) {_r(head.ranks)}{on} was gone while the others waited in a "
            "collective: a crash, an OOM kill or a node loss, or gloo aborting it because its arguments of that "
            "collective (size or dtype) differ from its peers' (the dumps cannot tell which)",
            (f"the log of rank(s) {_r(head.ranks)}: `{_GLOO_ABORT}` there means the arguments differ (the rank with the "
             "smaller buffer is the one aborted): fix the program", *advice), RestartAction.do_not_restart,
            "if gloo aborted it for mismatched arguments, a restart fails the same way: restart once its log shows "
            "another cause (an OOM kill, a node failure)")
    if hosts and set(hosts) != set(summary.hosts.values()):  # never advise excluding every host of the job
        return Classification(HangKind.rank_lost, f"the process of rank(s) {_r(head.ranks)}{on} was gone (crash, "
                              "OOM kill or node loss) while the others waited for it", advice,
                              RestartAction.restart_excluding_hosts, "a lost rank's host may be sick: restart "
                              "without it (SLURM --exclude) unless its log shows a bug of the program", hosts)
    return Classification(HangKind.rank_lost, f"the process of rank(s) {_r(head.ranks)} was gone (crash, OOM kill "
                          "or node loss) while the others waited for it", advice, RestartAction.restart,
                          "a lost rank is restartable; its host is unknown, so none can be excluded")


_MISMATCHES = (Verdict.SIZE_MISMATCH, Verdict.DTYPE_MISMATCH, Verdict.OP_MISMATCH)
_GLOO_ABORT = "EnforceNotMet ... op.preamble.length <= op.nbytes"
_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "read error", "write error")


def exit_description(exit_: Any) -> str | None:
    """``ended with SIGABRT (status 134)``, ``exited with status 1``; None when unknown."""
    if not isinstance(exit_, dict):
        return None
    sig, status = exit_.get("signal"), exit_.get("status")
    if sig:
        return f"ended with {sig}" + (f" (status {status})" if status is not None else "")
    if status is not None:
        return f"exited with status {status}"
    return None


_ABORT = ("SIGABRT", 134)


def _aborted(summary: Summary, ranks: tuple[int, ...], every: bool = True) -> dict[int, dict]:
    """Of ``ranks``, those whose process is known to have ended with SIGABRT (status 134), with
    how it ended; with ``every``, {} unless every one of them did."""
    exits = summary.context.get("rank_exits") or {}
    found = {r: exits[str(r)] for r in ranks if isinstance(exits.get(str(r)), dict)
             and (exits[str(r)].get("signal") == _ABORT[0] or exits[str(r)].get("status") == _ABORT[1])}
    return found if not every or (ranks and len(found) == len(ranks)) else {}


def _aborted_in_a_collective(summary: Summary, head: Finding, aborted: dict[int, dict]) -> Classification:
    """A gloo rank whose process ended with SIGABRT while its peers waited in (or lost their
    connection in) a collective: gloo aborts the rank whose buffer is smaller than what the call
    sends it, so the arguments of that collective differ."""
    ranks = tuple(sorted(aborted))
    how = exit_description(aborted[ranks[0]]) or "ended with SIGABRT"
    source = aborted[ranks[0]].get("known_from")
    reason = (f"the process of rank(s) {_r(ranks)} {how.replace('ended', 'was aborted', 1)} inside a collective "
              f"of gloo group {_group_name(head)} while the others waited in {head.op} (seq {head.seq}) or lost their "
              "connection to it: gloo aborts a rank whose arguments of a collective (size or dtype) differ from its "
              "peers'")
    advice = (f"the log of rank(s) {_r(ranks)}: `{_GLOO_ABORT}` names the collective (the rank with the smaller "
              "buffer is the one aborted)",
              "make the size and dtype of that collective the same on every rank (look for a rank-dependent shape, "
              "a batch that is not padded, or a dtype cast on one path)",
              *([f"how it ended is known from {source}"] if source else []))
    return Classification(HangKind.argument_mismatch, reason, advice, RestartAction.do_not_restart,
                          "gloo aborted it for mismatched arguments: a restart runs the same code and fails the "
                          "same way")


def _lost_its_peer(text: str) -> bool:
    """The exception of a rank whose peer went away (gloo's transport), not of its own code."""
    return any(word in text.lower() for word in _PEER_LOST)


def _mismatch_that_aborted(summary: Summary, head: Finding, raised: dict[str, str]) -> Classification:
    """A mismatched collective whose culprit then lost its connection to a peer: gloo aborts the
    process of the rank that receives more than its buffer holds; the exception is a consequence."""
    c = _mismatch(summary, head)
    gone = [r for r in summary.ranks_missing if r not in head.ranks]
    rank, text = next(iter(sorted(raised.items(), key=lambda kv: int(kv[0]))))
    line = (f"rank {rank} then lost its connection to a peer ({text.splitlines()[0][:160]}): gloo aborts the process "
            f"of a rank whose buffer is smaller than what the mismatched call sends it (`{_GLOO_ABORT}` in its log)"
            + (f"; rank(s) {_r(tuple(gone))} left no dump" if gone else ""))
    return replace(c, advice=c.advice + (line,))


def _with_aborted_peers(summary: Summary, head: Finding, c: Classification) -> Classification:
    """A gloo mismatch whose peer left no dump (before any rank raised): say why that rank is
    gone, and how it ended where known."""
    gone = tuple(r for r in summary.ranks_missing if r not in head.ranks)
    if not gone or head.group.lib != "gloo":
        return c
    ended = "; ".join(f"rank {r} {exit_description(e)}" for r, e in sorted(_aborted(summary, gone, every=False).items()))
    line = (f"rank(s) {_r(gone)} left no dump{f' ({ended})' if ended else ''}: gloo aborts the process of a rank "
            f"whose buffer is smaller than what the mismatched call sends it (`{_GLOO_ABORT}` in its log)")
    return replace(c, advice=c.advice + (line,))


def _others_in_a_collective(summary: Summary, head: Finding) -> bool:
    """The others waited in a collective when the rank went, or lost their connection to it there."""
    waiting = set(head.waiting_ranks)
    if any(row.rank in waiting and row.state == "in_collective" for row in summary.per_rank):
        return True
    raised = summary.context.get("exceptions") or {}
    return any(str(r) in raised and _lost_its_peer(str(raised[str(r)])) for r in waiting)


_TRANSIENT = ("cuda", "nccl", "out of memory", "timeout", "timed out", "ecc", "connection", "socket", "broken pipe",
              "xid", "device-side")


def _raised(summary: Summary, head: Finding, raised: dict[str, str]) -> Classification:
    rank, text = next(iter(sorted(raised.items(), key=lambda kv: int(kv[0]))))
    host = summary.hosts.get(int(rank))
    advice = (f"rank {rank}{' on ' + host if host else ''} raised {text}: its log has the traceback",
              f"the others ({_r(head.waiting_ranks)}) wait for it in {head.op} (seq {head.seq})")
    reason = f"rank {rank} raised an exception and left the collectives ({text.splitlines()[0][:200]})"
    aborted = _aborted(summary, tuple(r for r in summary.ranks_missing if r not in head.ranks), every=False)
    if aborted and head.group.lib == "gloo" and all(_lost_its_peer(e) for e in raised.values()):
        # its peer was aborted by gloo (SIGABRT) inside the collective: the lost connection is a consequence
        return _aborted_in_a_collective(summary, head, aborted)
    if any(word in text.lower() for word in _TRANSIENT):
        return Classification(HangKind.rank_lost, reason, advice, RestartAction.restart,
                              "the exception comes from the GPU, NCCL or the network: a restart may pass")
    return Classification(HangKind.rank_lost, reason, advice, RestartAction.do_not_restart,
                          "the program raised: a restart raises it again unless the cause was outside it")


def _missing(summary: Summary, head: Finding) -> Classification:
    states = {c.state for c in head.culprit_states}
    if states == {"process_gone"}:
        return _lost(summary, head)
    silent = next((c for c in head.culprit_states if c.state == "no_answer"), None)
    if silent is not None:
        return _stuck(summary, head, _silent_activity(silent))
    return Classification(
        HangKind.unknown, f"rank(s) {_r(head.ranks)} left no dump and whether their process was alive is not "
        "known (no collection.json from the watchdog, or a dump that was never written)",
        (f"the log of rank(s) {_r(head.ranks)} and whether the process still runs on its host",
         "summarize the dumps the watchdog collected (they carry collection.json) rather than loose files"),
        RestartAction.restart, "nothing points at the program; a restart is the cheap test")


def _raised_without_hang(summary: Summary, raised: dict[str, str]) -> Classification:
    """A rank raised and no rank waits for another: an exception, not a hang, and not the end of
    training (the raising rank's phase reads idle once its exception is being handled)."""
    rank, text = next(iter(sorted(raised.items(), key=lambda kv: int(kv[0]))))
    host = summary.hosts.get(int(rank))
    first_line = text.splitlines()[0][:200] if text.strip() else text
    reason = (f"rank {rank}{' on ' + host if host else ''} raised an exception ({first_line}) and the dumps agree: "
              "no rank waits for another")
    advice = (f"rank {rank}'s log has the traceback",)
    if any(word in text.lower() for word in _TRANSIENT):
        return Classification(HangKind.no_hang, reason, advice, RestartAction.restart,
                              "the exception comes from the GPU, NCCL or the network: a restart may pass")
    return Classification(HangKind.no_hang, reason, advice, RestartAction.do_not_restart,
                          "the program raised: a restart raises it again unless the cause was outside it")


def _without_finding(summary: Summary) -> Classification:
    rows = [r for r in summary.per_rank if r.rank in set(summary.ranks_seen)]
    if str(summary.context.get("event") or "").startswith("ondemand-"):
        return Classification(HangKind.no_hang, "dumped on demand and the ranks agree: ranks inside the same "
                              "collective at that instant is normal", (), RestartAction.restart,
                              "nothing is wrong in the dumps")
    if not summary.ranks_seen:
        return Classification(HangKind.unknown, "no readable flight-recorder dump: nothing to decide from",
                              ("check that the flight recorder is on (TORCH_FR_BUFFER_SIZE > 0) and the dump folder",),
                              RestartAction.restart, "nothing points at the program; a restart is the cheap test")
    if rows and all(r.state == "in_collective" for r in rows) and not summary.ranks_missing:
        finished, unconfirmed = _device_word(summary, rows)
        if unconfirmed and confirmed_stall(summary) and (finished or _in_program(summary, rows)):
            return _program_stalled(summary, rows, unconfirmed)
        if not finished:
            return _collective_stalled(summary, rows, unconfirmed)
    raised = {r: e for r, e in (summary.context.get("exceptions") or {}).items() if str(r).isdigit() and e}
    if raised:
        return _raised_without_hang(summary, raised)
    if _phases(summary) == {"idle"}:
        return Classification(HangKind.teardown, "training had ended on every rank (phase idle) and the dumps agree",
                              ("look for a barrier or collective after trainer.fit that not every rank reaches",),
                              RestartAction.do_not_restart, "training had finished: restarting would redo work")
    if rows and confirmed_stall(summary):
        return _program_stalled(summary, rows, None)
    return Classification(HangKind.no_hang, "every rank agrees: no rank is missing from a collective",
                          (), RestartAction.restart, "nothing is wrong in the dumps")


def _collective_stalled(summary: Summary, rows: list[RankRow], unconfirmed: str | None) -> Classification:
    hosts = sorted(set(summary.hosts.values()))
    op = rows[0].detail.removeprefix("in ")
    reason = (f"every rank entered the same collective ({op}) and it never completed: the problem is below the "
              "program (GPU kernel, NVLink/network or NCCL)")
    if unconfirmed:
        reason = (f"every rank entered the same collective and none had finished it when it dumped, but {unconfirmed}; "
                  "if it did not finish, the problem is below the program (GPU kernel, NVLink/network or NCCL)")
    return Classification(
        HangKind.collective_stalled, reason,
        ("run NCCL's RAS client `ncclras` (NCCL >= 2.24) on a node of the job while it hangs",
         (f"the kernel log on {', '.join(hosts) or 'every host'}: `dmesg -T | grep -i xid` (GPU errors), "
          "link and NIC errors"),
         ("with ncclx.flight_recorder.timing=true the dumps tell started from completed per rank; rerun "
          "with NCCL_DEBUG=INFO")),
        RestartAction.restart, "the program agrees on every rank; a transient network or GPU fault is likely")


# Where every rank's main thread waits, when a restart could pass once the thing waited on answers.
_WAITS_ON_STORAGE = ("data loader", "checkpoint", "uninterruptible")


def _program_stalled(summary: Summary, rows: list[RankRow], unconfirmed: str | None) -> Classification:
    """No rank waits in a collective (or only in one the dumps cannot confirm as unfinished), and
    the watchdog confirmed that the training loop stopped: the program itself is stuck."""
    places: dict[str, list[int]] = {}
    for row in rows:
        places.setdefault(_main_thread_place(summary, row), []).append(row.rank)
    (where, ranks), *others = sorted(places.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    every = "every rank" if len(rows) > 1 and not others else f"rank(s) {_r(tuple(ranks))}"
    host = summary.hosts.get(ranks[0])
    phase = (summary.context.get("phase_by_rank") or {}).get(str(ranks[0]))
    in_phase = f" during {phase}" if phase else ""
    reason = (f"{every} stopped in the program{in_phase}, outside every collective: {where}; no rank waits for "
              "another, so the program itself is stuck there")
    if others:
        reason += "; " + "; ".join(f"rank(s) {_r(tuple(r))} {w}" for w, r in others[:3])
    advice = [f"rank {ranks[0]}{' on ' + host if host else ''} is {where}",
              f"look at {_where_advice(where)}"]
    if unconfirmed:
        advice.append(f"its last collective, {unconfirmed}; if `py-spy dump --native --pid` shows the main thread "
                      "in a CUDA synchronize or an NCCL call, the collective is what is stuck")
    if any(key in where for key in _WAITS_ON_STORAGE):
        restart_reason = ("every rank waits on the same loader or storage at once: check that it answers before a "
                          "restart, which otherwise stops at the same place")
    else:
        restart_reason = ("every rank stopped at the same place in the program's own code: a restart runs the same "
                          "code and stops there again; fix the program first")
    return Classification(HangKind.program_stalled, reason, tuple(advice), RestartAction.do_not_restart,
                          restart_reason)


def _main_thread_place(summary: Summary, row: RankRow) -> str:
    """Where a rank's main thread stopped, in words: its library wait if known, else its own code."""
    main = summary.at_dump.get(row.rank)
    activity = main.activity if main else None
    if activity is None and row.state == "outside_collective":
        activity = _activity(CulpritState(row.rank, row.state, row.detail, row.location))
    if activity:
        return activity
    frame = (main.frame if main else None) or (row.location if row.state != "in_collective" else None)
    return f"in its own code at {frame}" if frame else "in its own code (no stack in the dump)"


def _where_advice(where: str) -> str:
    what = where.split(":")[0]
    return next((advice for key, advice in _WHERE_ADVICE if key in what),
                "the code it is in: `py-spy dump --pid` on its host shows the whole stack")


def confirmed_stall(summary: Summary) -> bool:
    """The watchdog raised the event for a stall (not on demand, not for an exception), a rank's
    heartbeat was past its step threshold when it dumped, and the event did not recover."""
    if not str(summary.context.get("event") or "").startswith("stall-") or summary.recovery is not None:
        return False
    return any(a.seconds_since_heartbeat is not None and a.stall_threshold_seconds is not None
               and a.seconds_since_heartbeat >= a.stall_threshold_seconds for a in summary.at_dump.values())


_DEVICE_WAITS = ("torch.cuda.synchronize", "waiting for the GPU")


def _in_program(summary: Summary, rows: list[RankRow]) -> bool:
    """Every rank's stack is known and its main thread is not waiting for the GPU."""
    for row in rows:
        main = summary.at_dump.get(row.rank)
        if main is None or (main.frame is None and main.activity is None):
            return False
        if main.activity and any(w in main.activity for w in _DEVICE_WAITS):
            return False
    return True


def _device_word(summary: Summary, rows: list[RankRow]) -> tuple[bool, str | None]:
    """On NCCL without timing an entry that finished on the GPU can still read ``scheduled``
    (torch retires entries on its own watchdog's schedule), so "never completed" needs another
    word: torch's ``pg_status``. (True, text): it counts the op complete; (False, text): nothing
    says either way; (False, None): the dumps say unfinished and that stands."""
    libs = set(summary.context.get("backends") or ())
    if not libs or not all(str(lib).startswith("nccl") for lib in libs):
        return False, None
    if not all(r.detail.endswith("[scheduled]") for r in rows):
        return False, None
    words = {summary.at_dump[r.rank].open_op_completed if r.rank in summary.at_dump else None for r in rows}
    op = rows[0].detail.removeprefix("in ").removesuffix(" [scheduled]")
    age = _enqueued_before_dump(summary, rows[0])
    if True in words:
        return True, (f"{op} reads `scheduled`{age}, but torch's own watchdog had counted every op of its group "
                      "complete: it finished on the GPU and was not yet retired")
    if words == {False}:
        return False, None
    return False, (f"{op} reads `scheduled`{age}: with NCCL timing off the recorder cannot tell a collective "
                   "that finished on the GPU from one that never did")


def _enqueued_before_dump(summary: Summary, row: RankRow) -> str:
    main = summary.at_dump.get(row.rank)
    open_ops = [t for t in row.timeline if not t.done]
    if main is None or main.time_unix is None or not open_ops:
        return ""
    age = main.time_unix - open_ops[-1].time_ns / 1e9
    if not 0 <= age < 1e7:
        return ""
    beat = main.seconds_since_heartbeat
    moved = (f", and the training loop moved {age - beat:.1f} s after it was enqueued"
             if beat is not None and age - beat > 0.5 else "")
    return f" (enqueued {age:.1f} s before the dump{moved})"


# ------------------------------------------------------------------------------------ helpers
def _in_teardown(summary: Summary, head: Finding) -> bool:
    phases = summary.context.get("phase_by_rank") or {}
    culprit_phases = {phases.get(str(r)) for r in head.ranks} - {None}
    return bool(culprit_phases) and culprit_phases == {"idle"} and _phases(summary) == {"idle"}


def _phases(summary: Summary) -> set[str]:
    return set((summary.context.get("phase_by_rank") or {}).values())


def _activity(c: CulpritState) -> str | None:
    prefix = "outside any collective, "
    return c.detail[len(prefix):] if c.detail.startswith(prefix) else None


def _silent_activity(c: CulpritState) -> str:
    detail = c.detail.removeprefix(_ALIVE_PREFIX).lstrip(": ")
    if "uninterruptible" in detail:
        return f"in uninterruptible sleep ({detail})"
    if "stopped" in detail:
        return f"stopped ({detail})"
    return f"holding the GIL in native code, as its watchdog could not run ({detail})"


def _site(summary: Summary, ranks: tuple[int, ...]) -> str:
    """The call site of the first of ``ranks`` whose location is known."""
    where = {r.rank: r.location for r in summary.per_rank if r.location}
    for f in summary.findings:
        for c in f.culprit_states:
            if c.location:
                where.setdefault(c.rank, c.location)
    from lightning_ncclx.analysis.frames import is_library_file

    known = [str(where[r]) for r in ranks if where.get(r)]
    user = [w for w in known if not is_library_file(w.rsplit(":", 1)[0])]
    if user or known:
        return (user or known)[0]
    return "an unknown call site (no stack in the dump)"


def _group_name(head: Finding) -> str:
    """``1 (ranks 0-2)`` or ``3 (tp)``: what follows "group" wherever a report names one."""
    return f"{head.group.name} ({group_title(head.group.desc, head.group.ranks)})"


def _named(summary: Summary, text: str) -> str:
    """torch names a group it was not told the name of "undefined": say its ranks instead."""
    for f in summary.findings:
        g = f.group
        if g.desc in UNNAMED_DESCS and g.ranks:
            text = text.replace(f"group {g.name} (undefined)", f"group {g.name} ({group_title(g.desc, g.ranks)})")
    return text


def _r(ranks: tuple[int, ...]) -> str:
    ranks = tuple(ranks)
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{', '.join(map(str, ranks[:6]))}, ... ({len(ranks)})"
