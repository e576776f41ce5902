"""Who is sending an alert, and whether that process is gone.

Each sink's entry in the alert file names the process that holds its delivery (``sender``:
rank, host, pid, process start time, and the ``/proc`` scope of
:mod:`lightning_ncclx.events.liveness`). A rank of the same scope that finds a ``pending`` entry
whose sender has exited (SIGKILLed while sending) may send it instead, after claiming the next
takeover generation exclusively (:func:`~lightning_ncclx.alerts.outbox.takeover_claim_path`).
A sender of another scope (another host, another container) is never judged: any doubt reads
as alive."""

from __future__ import annotations

from typing import Any, Mapping

from lightning_ncclx.events.liveness import ProcessInfo, is_gone, process_scope, this_process

MAX_GENERATION = 64


def sender_record(rank: int, generation: int = 0) -> dict[str, Any] | None:
    """This process as the sender of an alert; None where others cannot check it."""
    info = this_process(rank)
    if info is None:
        return None
    return {"rank": info.rank, "host": info.host, "pid": info.pid, "start_ticks": info.start_ticks,
            "scope": info.scope, "generation": generation}


def generation_of(sender: Any) -> int:
    value = sender.get("generation") if isinstance(sender, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GENERATION else 0


def sender_gone(sender: Any) -> bool:
    """True only when ``sender`` (an entry's record) is a process of this scope that has exited."""
    if not isinstance(sender, Mapping):
        return False
    pid, ticks, rank = sender.get("pid"), sender.get("start_ticks"), sender.get("rank")
    if not (isinstance(pid, int) and isinstance(ticks, int) and isinstance(rank, int) and pid > 1
            and not isinstance(pid, bool)):
        return False
    scope = process_scope()
    if scope is None or sender.get("scope") != scope:
        return False
    return is_gone(ProcessInfo(rank, str(sender.get("host") or ""), pid, ticks, scope))
