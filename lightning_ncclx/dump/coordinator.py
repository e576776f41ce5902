"""How the ranks agree on one dump event and hand their dumps over, through the job's store.

Protocol (every key under the ``lightning_ncclx/`` prefix of the job's c10d store):

``ev/<n>/meta``
    JSON ``{"initiator", "reason", "name"}``. Event numbers are sequential; a rank that wants an
    event proposes ``n = last event it saw + 1`` with ``compare_set(key, "", proposal)``: the first
    proposal wins, and every concurrent proposer gets the winner's value back, so they all agree
    on one event id and one initiator (who also summarizes).
``ev/<n>/dumped``
    Counter (``add``) of ranks that have written their dump.
``ev/<n>/rank/<r>``
    JSON ``{"host", "files", "folder"}`` of rank ``r``'s dump.
``ev/<n>/blob/<r>``
    Rank ``r``'s dump files as a gzip'd tar (only with ``gather_through_store``; in a two-phase
    gather only once the initiator asked for them in ``want``).
``ev/<n>/digest/<r>``
    Two-phase gather: rank ``r``'s digest (:mod:`digest`), a gzip'd tar like the blob.
``ev/<n>/want``
    Two-phase gather: JSON list of the ranks whose full dumps the initiator asks for, after it
    diagnosed the digests (every other rank's full dump stays on its own disk).
``ev/<n>/done``
    JSON ``{"exit": true, "code": int, "kind": str, "advice": {...}}``, set by the initiator once the summary is written, only
    when the job is to end (the other ranks wait for it, then leave).
``ev/<n>/leaving``
    Counter of ranks on their way out of an ending job.
``bell/<r>``
    Rank ``r``'s doorbell (:mod:`doorbell`): the rank that starts event ``n`` sets every rank's
    bell in one ``multi_set``; each rank's listener, blocked in ``wait`` on its own bell, wakes,
    deletes it and polls ``ev/<n>/meta``. Only a rank that never woke (a dead one) leaves its
    bell behind.
``procs/<scope>``
    One JSON line per watchdog started in that scope (boot id and pid namespace: the processes
    that can see each other): ``{"rank", "host", "pid", "start_ticks", "scope"}``.
``ev/<n>/gone``
    Lines naming ranks whose process a rank on the same host found gone during event ``n``:
    the initiator stops waiting for them.

Once the summary is written the initiator deletes the event's keys (blobs, announcements,
counters) and marks ``meta`` closed (``"closed": true``), so a rank that dumps later does not
leave new keys behind; ``meta`` itself (about 100 bytes, at most ``max_dumps_per_run`` +
``max_on_demand_dumps`` of them) stays as the event log that keeps numbering in step.

Only non-blocking calls are used (``check`` before ``get``): ``TCPStore.get`` blocks until the key
exists. Nothing here runs per training step: the watchdog thread asks the store for the next event
only when its doorbell rang (or once per interval where the store has no doorbell).
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.dump.doorbell import ring_every_rank
from lightning_ncclx.dump.liveness import ProcessInfo, is_gone, state_of
from lightning_ncclx.files import atomic_write_bytes

log = logging.getLogger(__name__)

STORE_PREFIX = "lightning_ncclx"
MAX_BLOB_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class EventInfo:
    number: int
    name: str
    reason: str
    initiator: int

    def to_json(self, closed: bool = False) -> str:
        data: dict[str, Any] = {"name": self.name, "reason": self.reason, "initiator": self.initiator}
        if closed:
            data["closed"] = True
        return json.dumps(data)

    @classmethod
    def from_json(cls, number: int, raw: bytes | str) -> "EventInfo":
        data = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        return cls(number=number, name=str(data["name"]), reason=str(data["reason"]), initiator=int(data["initiator"]))


def _is_closed(raw: bytes | None) -> bool:
    try:
        return raw is not None and bool(json.loads(raw).get("closed"))
    except (ValueError, AttributeError):
        return False


def event_name(reason: str, number: int, rank: int) -> str:
    if reason == "exception":
        return f"exception-rank{rank}-{number:03d}"
    if reason == "on_demand":
        return f"ondemand-{number:03d}"
    return f"stall-{number:03d}"


def open_job_store() -> Any:
    """A private client of the default process group's store, under our prefix.

    A clone has its own connection, so a request from the watchdog thread never queues behind the
    main thread's store traffic. Falls back to the shared client when cloning is not supported.
    """
    from torch.distributed import PrefixStore
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    try:
        store = store.clone()
    except Exception:  # noqa: BLE001 - older torch or a store without clone()
        log.debug("store.clone() unavailable; sharing the default store client", exc_info=True)
    return PrefixStore(STORE_PREFIX, store)


def pack_files(files: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for path in files:
            tar.add(str(path), arcname=path.name, recursive=False)
    return buffer.getvalue()


def pack_named(files: dict[str, bytes]) -> bytes:
    """Like :func:`pack_files`, from names and contents (a digest that is never written here)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def unpack_files(blob: bytes, folder: Path, skip: Callable[[str], bool] = lambda name: False) -> list[Path]:
    """Extract the regular files of a packed dump into ``folder`` (plain names only)."""
    written: list[Path] = []
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if not member.isfile() or name != member.name or name.startswith(".") or skip(name):
                continue
            handle = tar.extractfile(member)
            if handle is not None:
                written.append(atomic_write_bytes(folder / name, handle.read()))
    return written


class EventCoordinator:
    """The store side of dump events for one rank. Thread: the watchdog's (or main on exception)."""

    def __init__(self, store: Any, rank: int, world_size: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.last_seen = 0
        self.name_taken: Callable[[str], bool] = lambda name: False
        """Set by the owner: True when an event folder of that name exists (an earlier run)."""
        self.rings_doorbells = False
        """Set by the owner where ranks listen for events (:mod:`doorbell`) instead of polling."""
        self._clock = clock
        self._sleep = sleep
        self._me: ProcessInfo | None = None
        self._reported_gone: dict[int, set[int]] = {}

    def _get_if_present(self, key: str) -> bytes | None:
        if not self.store.check([key]):
            return None
        return self.store.get(key)

    def propose(self, reason: str) -> EventInfo:
        """Ask for an event; returns the one agreed on (ours, or a concurrent proposer's that won)."""
        number = self.last_seen + 1
        name = event_name(reason, number, self.rank)
        try:
            if self.name_taken(name):
                name = f"{name}-{int(time.time())}"
        except Exception:  # noqa: BLE001
            pass
        mine = EventInfo(number, name, reason, self.rank)
        raw = self.store.compare_set(f"ev/{number}/meta", "", mine.to_json())
        self.last_seen = number
        agreed = EventInfo.from_json(number, raw)
        if self.rings_doorbells and agreed.initiator == self.rank:
            try:
                ring_every_rank(self.store, self.world_size, number)
            except Exception:  # noqa: BLE001 - the others still start it when their own threshold passes
                log.warning("[rank %d] ringing the other ranks for event %d failed", self.rank, number,
                            exc_info=True)
        return agreed

    def skip_past_events(self) -> int:
        """Start after the events already in the store, and return how many there were.

        ``trainer.validate`` or a second ``fit`` after a fit keeps the process group and its
        store, but starts a new watchdog: without this it would take the earlier events for
        new ones and dump every rank again, over the earlier dump."""
        number = self.last_seen
        while self.store.check([f"ev/{number + 1}/meta"]):
            number += 1
        self.last_seen = number
        return number

    def poll(self) -> EventInfo | None:
        """The next event another rank started, if any (one ``check`` round trip)."""
        number = self.last_seen + 1
        raw = self._get_if_present(f"ev/{number}/meta")
        if raw is None:
            return None
        self.last_seen = number
        return EventInfo.from_json(number, raw)

    def is_closed(self, event: EventInfo) -> bool:
        """True once the initiator has written the summary and cleared the event's keys."""
        return _is_closed(self._get_if_present(f"ev/{event.number}/meta"))

    def announce_dumped(self, event: EventInfo, host: str, files: list[Path], folder: Path, upload: bool,
                        digest: dict[str, bytes] | None = None) -> None:
        """Tell the initiator where this rank's dump is (and send it, with ``upload``: the whole
        dump, or only ``digest`` in a two-phase gather). A rank that dumps after the summary was
        written keeps its dump on disk and adds no keys."""
        if event.initiator != self.rank and self.is_closed(event):
            log.info("[rank %d] %s is already summarized: this rank's dump stays in %s", self.rank, event.name, folder)
            return
        if upload and digest is not None:
            try:
                self.store.set(f"ev/{event.number}/digest/{self.rank}", pack_named(digest))
            except Exception:  # noqa: BLE001
                log.warning("[rank %d] sending the digest through the store failed", self.rank, exc_info=True)
        elif upload and files:
            self.upload_full(event, files)
        meta = {"host": host, "files": [p.name for p in files], "folder": str(folder)}
        self.store.set(f"ev/{event.number}/rank/{self.rank}", json.dumps(meta))
        self.store.add(f"ev/{event.number}/dumped", 1)
        if event.initiator != self.rank and self.is_closed(event):  # closed while we announced
            self._delete(self._rank_keys(event, self.rank))

    def upload_full(self, event: EventInfo, files: list[Path]) -> None:
        try:
            blob = pack_files(files)
            if len(blob) > MAX_BLOB_BYTES:
                log.warning("[rank %d] dump of %s is %d bytes: not sent through the store", self.rank,
                            event.name, len(blob))
            else:
                self.store.set(f"ev/{event.number}/blob/{self.rank}", blob)
        except Exception:  # noqa: BLE001
            log.warning("[rank %d] sending the dump through the store failed", self.rank, exc_info=True)

    def request_full_dumps(self, event: EventInfo, ranks: list[int]) -> None:
        """Initiator, two-phase gather: ask these ranks for their whole dumps."""
        self.store.set(f"ev/{event.number}/want", json.dumps(sorted(ranks)))

    def serve_full_dump(self, event: EventInfo, files: list[Path], timeout_seconds: float,
                        poll_seconds: float = 0.2) -> bool:
        """Any other rank, two-phase gather: wait until the initiator says which full dumps it
        wants (or closes the event) and send this rank's if asked; True when it was sent."""
        deadline = self._clock() + timeout_seconds
        while self._clock() < deadline:
            raw = self._get_if_present(f"ev/{event.number}/want")
            if raw is not None:
                try:
                    wanted = {int(r) for r in json.loads(raw)}
                except (ValueError, TypeError):
                    return False
                if self.rank in wanted and files:
                    self.upload_full(event, files)
                    return True
                return False
            if self.is_closed(event):
                return False
            self._sleep(poll_seconds)
        return False

    def fetch_digest(self, event: EventInfo, rank: int) -> bytes | None:
        return self._get_if_present(f"ev/{event.number}/digest/{rank}")

    def dumped_count(self, event: EventInfo) -> int:
        return int(self.store.add(f"ev/{event.number}/dumped", 0))

    # ------------------------------------------------------------------ processes that are gone
    def register_process(self, me: ProcessInfo | None) -> None:
        """Once per watchdog: lets the other ranks of ``me.scope`` check on this process (None:
        this process cannot be checked, and checks nobody)."""
        if me is None or not me.scope:
            return
        self.store.append(f"procs/{me.scope}", me.to_json() + "\n")
        self._me = me

    def _peers_in_scope(self) -> dict[int, ProcessInfo]:
        if self._me is None:
            return {}
        raw = self._get_if_present(f"procs/{self._me.scope}")
        latest: dict[int, ProcessInfo] = {}
        for line in (raw or b"").decode(errors="replace").splitlines():
            try:
                info = ProcessInfo.from_json(line)
            except (ValueError, KeyError, TypeError):
                continue
            if info.rank != self.rank and info.scope == self._me.scope:
                latest[info.rank] = info
        return latest

    def silent_local_ranks(self, ranks: list[int]) -> dict[int, tuple[ProcessInfo, str]]:
        """Of ``ranks`` (that did not dump), those of this scope whose process is alive, with its
        ``/proc`` state letter: alive, yet its watchdog never answered."""
        out: dict[int, tuple[ProcessInfo, str]] = {}
        peers = self._peers_in_scope()
        for r in ranks:
            info = peers.get(r)
            state = state_of(info) if info is not None else None
            if info is not None and state is not None:
                out[r] = (info, state)
        return out

    def check_local_peers(self, event: EventInfo) -> set[int]:
        """Ranks of this host whose process is gone (newly found ones are reported to all)."""
        gone = {r for r, info in self._peers_in_scope().items() if is_gone(info)}
        reported = self._reported_gone.setdefault(event.number, set())
        new = sorted(gone - reported)
        if new:
            self.store.append(f"ev/{event.number}/gone", "".join(f"{r}\n" for r in new))
            reported.update(new)
        return gone

    def gone_ranks(self, event: EventInfo) -> set[int]:
        """Every rank some rank of its host reported gone during ``event``."""
        raw = self._get_if_present(f"ev/{event.number}/gone")
        return {int(x) for x in (raw or b"").split() if x.isdigit()}

    def _missing_but_gone(self, event: EventInfo) -> int:
        self.check_local_peers(event)
        return sum(1 for r in self.gone_ranks(event) if not self.store.check([f"ev/{event.number}/rank/{r}"]))

    def wait_for_dumps(self, event: EventInfo, timeout_seconds: float, poll_seconds: float = 0.1,
                       liveness_every_seconds: float = 0.5) -> dict[int, dict]:
        """Rank -> its announcement, once every rank announced (or is gone: its process exited)
        or the deadline passed."""
        deadline = self._clock() + timeout_seconds
        next_liveness = self._clock()
        while self._clock() < deadline:
            count = self.dumped_count(event)
            if count >= self.world_size:
                break
            if self._clock() >= next_liveness:
                next_liveness = self._clock() + liveness_every_seconds
                try:
                    if count + self._missing_but_gone(event) >= self.world_size:
                        break
                except Exception:  # noqa: BLE001 - without liveness, wait for the deadline
                    log.warning("[rank %d] checking for exited ranks failed; waiting for every dump instead",
                                self.rank, exc_info=True)
                    next_liveness = deadline  # once per event, not every poll
            self._sleep(poll_seconds)
        found: dict[int, dict] = {}
        for rank in range(self.world_size):
            raw = self._get_if_present(f"ev/{event.number}/rank/{rank}")
            if raw is not None:
                found[rank] = json.loads(raw)
        return found

    def fetch_blob(self, event: EventInfo, rank: int) -> bytes | None:
        return self._get_if_present(f"ev/{event.number}/blob/{rank}")

    # ------------------------------------------------------------------ the end of an event
    def _rank_keys(self, event: EventInfo, rank: int) -> list[str]:
        return [f"ev/{event.number}/rank/{rank}", f"ev/{event.number}/blob/{rank}", f"ev/{event.number}/digest/{rank}"]

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                self.store.delete_key(key)
            except Exception:  # noqa: BLE001 - a store without delete_key keeps the key
                log.debug("deleting store key %s failed", key, exc_info=True)

    def close(self, event: EventInfo) -> None:
        """Initiator, once the summary is written: mark the event closed, then delete its keys
        (the dumps are on disk now; blobs are the store host's biggest memory)."""
        self.store.set(f"ev/{event.number}/meta", event.to_json(closed=True))
        keys = [f"ev/{event.number}/dumped", f"ev/{event.number}/gone", f"ev/{event.number}/want"]
        for rank in range(self.world_size):
            keys += self._rank_keys(event, rank)
        self._delete(keys)

    def mark_done(self, event: EventInfo, exit_code: int, kind: str | None = None, advice: dict | None = None) -> None:
        """The job ends: every rank leaves with ``exit_code`` (and hears the hang kind)."""
        done = {"exit": True, "code": int(exit_code), "kind": kind, "advice": advice or {}}
        self.store.set(f"ev/{event.number}/done", json.dumps(done, default=str))

    def leaving(self, event: EventInfo, timeout_seconds: float, poll_seconds: float = 0.1) -> None:
        """Say this rank exits; the store's host (rank 0) waits for the others first, so their
        last store calls do not hit a closed server."""
        count = self.store.add(f"ev/{event.number}/leaving", 1)
        if self.rank != 0:
            return
        deadline = self._clock() + timeout_seconds
        while count < self.world_size and self._clock() < deadline:
            self._sleep(poll_seconds)
            count = self.store.add(f"ev/{event.number}/leaving", 0)

    def launcher_parent(self) -> ProcessInfo | None:
        """The rank whose process started this one, if any: Lightning's own launcher runs local
        rank 0 in the launching process and the other local ranks as its children. That parent
        has to exit first, or its child-process observer SIGKILLs it (and the job reports -9)
        as soon as it sees a child exit."""
        ppid = os.getppid()
        for info in self._peers_in_scope().values():
            if info.pid == ppid:
                return info
        return None

    def wait_done(self, event: EventInfo, timeout_seconds: float, poll_seconds: float = 0.2) -> dict | None:
        deadline = self._clock() + timeout_seconds
        while True:
            raw = self._get_if_present(f"ev/{event.number}/done")
            if raw is not None:
                return json.loads(raw)
            if self._clock() >= deadline:
                return None
            self._sleep(poll_seconds)
