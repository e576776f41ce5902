"""An exception names the rank that raised it.

A rank that raises leaves the collectives; the rank that noticed dumps every rank a few
milliseconds later. A peer caught just before the collective that the raising rank never reached
looks exactly like it in the dumps ("outside any collective"), so the head finding named both.
The exception is the cause: only the ranks that raised stay culprits of the head finding, and the
others are named in its evidence as behind them.

Example::

    raised_first(findings, {1: "RuntimeError: injected"})   # head ranks (1, 2) -> (1,)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from lightning_ncclx.analysis.model import Finding
from lightning_ncclx.analysis.wording import ranks_text


def raised_first(findings: list[Finding], exceptions: Mapping[int, str]) -> list[Finding]:
    """``findings`` with the head's culprits cut to the ranks that raised, where it names both
    ranks that raised and ranks that did not (unchanged otherwise)."""
    if not findings or not exceptions:
        return findings
    head = findings[0]
    raised = tuple(r for r in head.ranks if exceptions.get(r))
    behind = tuple(r for r in head.ranks if not exceptions.get(r))
    if not raised or not behind:
        return findings
    note = (f"rank(s) {ranks_text(behind)} had not reached {head.op} (seq {head.seq}) either when they dumped, "
            f"moments after rank(s) {ranks_text(raised)} raised: behind the exception, not its cause")
    message = (f"{head.kind.value}: rank(s) {ranks_text(raised)} raised an exception and never entered {head.op} "
               f"(seq {head.seq}) of group {head.group.name}"
               + (f"; rank(s) {ranks_text(head.waiting_ranks)} are waiting in it" if head.waiting_ranks else ""))
    narrowed = replace(
        head, ranks=raised, message=message, evidence=(*head.evidence, note),
        observed={r: s for r, s in head.observed.items() if r in raised},
        culprit_states=tuple(c for c in head.culprit_states if c.rank in raised))
    return [narrowed, *findings[1:]]
