"""Every store key of the protocol between ranks, and the names an event may take, in one place.

All keys live under ``STORE_PREFIX`` of the job's store (see :mod:`connection`). Example::

    meta_key(3)          # "ev/3/meta"
    is_event_name("stall-003", "stall", 3, initiator=1, world_size=8)   # True
"""

from __future__ import annotations

import re

STORE_PREFIX = "lightning_ncclx"
REASONS = ("stall", "on_demand", "exception")


def event_key(number: int, leaf: str) -> str:
    return f"ev/{number}/{leaf}"


def meta_key(number: int) -> str:
    """JSON :class:`~lightning_ncclx.events.wire.EventMeta`; proposed with ``compare_set``."""
    return event_key(number, "meta")


def rank_key(number: int, rank: int) -> str:
    """One rank's announcement (and, in a two-phase gather, its digest) in one value."""
    return event_key(number, f"rank/{rank}")


def blob_key(number: int, rank: int, chunk: int | None = None) -> str:
    """A rank's packed full dump: the manifest, or chunk ``chunk`` of it."""
    base = event_key(number, f"blob/{rank}")
    return base if chunk is None else f"{base}/{chunk}"


ROSTERS = ("dumped", "moved", "leaving")


def roster_key(number: int, name: str = "dumped") -> str:
    """Lines of rank numbers each rank appends itself to: ``dumped`` once its announcement is
    set, ``moved`` once its heartbeat moved past the event, ``leaving`` on its way out. Appends,
    not counters: ``add`` on a value another client planted fails and costs the connection, and a
    list says who, so a planted line counts once and only for a rank of the job."""
    return event_key(number, name)


def want_key(number: int) -> str:
    return event_key(number, "want")


def outcome_key(number: int) -> str:
    """The initiator's last word on an event: recovered, or the job ends (and with what)."""
    return event_key(number, "outcome")


def pulse_key(number: int) -> str:
    """A count the summarizing rank rewrites about once a second while the event is its to
    decide: where ``/proc`` cannot tell (another host), a rank finds it gone once the count stops
    (:mod:`lightning_ncclx.watchdog.initiator_pulse`)."""
    return event_key(number, "pulse")


def alert_claim_key(number: int) -> str:
    """Who sends the event's trigger alert (:mod:`lightning_ncclx.alerts.claim`)."""
    return event_key(number, "alert")


def gone_key(number: int) -> str:
    return event_key(number, "gone")


def procs_key(scope: str) -> str:
    return f"procs/{scope}"


def bell_key(rank: int) -> str:
    return f"bell/{rank}"


EVENT_NAME_PATTERN = re.compile(r"^(?:stall|ondemand|exception-rank[0-9]{1,7})-[0-9]{3,9}(?:-[0-9]{1,12})?$")
"""What every event folder is called: ``stall-001``, ``ondemand-002``, ``exception-rank3-004``,
with ``-<unix time>`` where an earlier run's folder had that name already."""


def event_name(reason: str, number: int, rank: int) -> str:
    if reason == "exception":
        return f"exception-rank{rank}-{number:03d}"
    if reason == "on_demand":
        return f"ondemand-{number:03d}"
    return f"stall-{number:03d}"


def is_event_name(name: str, reason: str, number: int, initiator: int) -> bool:
    """True when ``name`` is what :func:`event_name` gives for these values (optionally with a
    ``-<unix time>`` suffix): a plain folder name that stays inside the dump folder."""
    if not isinstance(name, str) or not EVENT_NAME_PATTERN.match(name):
        return False
    expected = event_name(reason, number, initiator)
    return name == expected or (name.startswith(expected + "-") and name[len(expected) + 1:].isdigit())


SAFE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")
"""A host name or a dump file name read from the store: one plain path component."""


def is_safe_name(name: object) -> bool:
    return isinstance(name, str) and bool(SAFE_NAME_PATTERN.match(name)) and ".." not in name


def safe_host(host: str) -> str:
    """``host`` as one plain path component (what the other ranks accept from the store)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.+-]", "_", host or "")[:128].lstrip(".-+").replace("..", "_")
    return cleaned or "unknown-host"
