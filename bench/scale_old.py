"""The event protocol before ``events/`` (commit 50a4304: ``dump/coordinator.py``, ``dump/doorbell.py``,
``dump/summarize.py``, ``watchdog/runtime.py``), re-implemented call for call for
``bench_event_scale.py``: it is gone from the package. Only its store requests and their payloads
are reproduced; the initiator's local work (expanding digests, the analyzer) is not re-run: the
bench waits as long as the new protocol's same steps took in the same run.

Per rank: the doorbell's ``wait``, ``get`` and ``delete_key``; ``check`` + ``get`` of ``meta``
(poll); ``is_closed`` (``check`` + ``get``), the digest (a gzip'd tar, ~1.4 KiB), the
announcement, ``add`` to ``dumped``, ``is_closed`` again; ``check`` + ``get`` of ``procs``; then
every 0.2 s ``check`` of ``want`` and ``is_closed`` until ``want`` appears (80 s at most), a full
dump with ``set`` when wanted; then every 0.2 s ``check`` of ``done`` (80 s at most, else exit
75); ``check`` + ``get`` of ``procs`` and ``add`` to ``leaving``.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import tarfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from lightning_ncclx.analysis.safe_pickle import safe_loads

OLD_ENTRIES_PER_GROUP = 8
OLD_WAIT_SECONDS = 20.0 + 60.0
"""``serve_full_dump`` and ``wait_done``: ``collect_timeout_seconds`` + ``EXIT_WAIT_MARGIN_SECONDS``."""
OLD_POLL_SECONDS = 0.2
OLD_EXIT_CODE = 75


def _trim(trace: dict) -> dict:
    """50a4304's ``trim_trace``: the newest 8 entries per group with their frames; member lists
    of more than 64 ranks as a hash."""
    kept, seen = [], {}
    for entry in reversed(trace.get("entries", [])):
        key = (str(entry["process_group"][0]), bool(entry.get("is_p2p")))
        if seen.get(key, 0) < OLD_ENTRIES_PER_GROUP:
            seen[key] = seen.get(key, 0) + 1
            kept.append(entry)
    config = {}
    for name, group in trace.get("pg_config", {}).items():
        ranks = group["ranks"]
        if ranks.count(",") + 1 > 64:
            group = dict(group, ranks="members-blake2b:" + hashlib.blake2b(ranks.encode(), digest_size=16).hexdigest())
        config[name] = group
    return dict(trace, entries=kept[::-1], pg_config=config)


def old_digest(files: list[Path]) -> bytes:
    """50a4304's ``digest_files`` + ``pack_named``: a gzip'd tar of the trimmed files."""
    members: dict[str, bytes] = {}
    for path in files:
        data = path.read_bytes()
        if path.name.endswith("fr.pkl"):
            members[path.name] = pickle.dumps(_trim(safe_loads(data)))
        elif path.name.endswith("context.json"):
            context = {k: v for k, v in json.loads(data).items() if k not in ("pg_config", "flight_recorder")}
            members[path.name] = json.dumps(dict(context, digest=True)).encode()
        else:
            text = data.decode()
            start = text.find("--- thread 'MainThread'")
            members[path.name] = text[start:start + 8192].encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _present(store: Any, key: str) -> bytes | None:
    """50a4304's ``_get_if_present``: ``check``, then ``get``."""
    return store.get(key) if store.check([key]) else None


class OldRank:
    """One rank's watchdog of 50a4304 during one event (its calls only)."""

    def __init__(self, rank: int, world: int, store: Any, listen: Any, host: str, scope: str,
                 digest: bytes, files: Callable[[], list[Path]], pack: Callable[[list[Path]], bytes]) -> None:
        self.rank, self.world, self.store, self.listen = rank, world, store, listen
        self.host, self.scope, self.digest, self.files, self.pack = host, scope, digest, files, pack
        self.code: int | None = None
        self.note = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.listen.wait([f"bell/{self.rank}"], timedelta(seconds=600))
            self.listen.get(f"bell/{self.rank}")
            self.listen.delete_key(f"bell/{self.rank}")
            raw = _present(self.store, "ev/1/meta")  # poll
            if raw is None:
                self.note = "no event"
                return
            self._announce()
            _present(self.store, f"procs/{self.scope}")  # check_local_peers
            self._serve_full_dump()
            done = self._wait_done()
            code = int(done.get("code", OLD_EXIT_CODE)) if done else OLD_EXIT_CODE
            self.note = "outcome" if done else "gave up"
            _present(self.store, f"procs/{self.scope}")  # launcher_parent
            self.store.add("ev/1/leaving", 1)
            self.code = code
        except Exception as error:  # noqa: BLE001 - a request that failed: the rank's watchdog logs it
            self.note = f"{type(error).__name__}: {str(error)[:60]}"

    def _is_closed(self) -> bool:
        raw = _present(self.store, "ev/1/meta")
        return raw is not None and bool(json.loads(raw).get("closed"))

    def _announce(self) -> None:
        if self._is_closed():
            return
        self.store.set(f"ev/1/digest/{self.rank}", self.digest)
        names = [f"rank_{self.rank:05d}.{suffix}" for suffix in ("nccl.fr.pkl", "context.json", "stacks.txt")]
        self.store.set(f"ev/1/rank/{self.rank}", json.dumps({"host": self.host, "files": names,
                                                             "folder": "/scratch/run/ncclx_dumps/stall-001"}))
        self.store.add("ev/1/dumped", 1)
        self._is_closed()

    def _serve_full_dump(self) -> None:
        deadline = time.monotonic() + OLD_WAIT_SECONDS
        while time.monotonic() < deadline:
            raw = _present(self.store, "ev/1/want")
            if raw is not None:
                if self.rank in set(json.loads(raw)):
                    self.store.set(f"ev/1/blob/{self.rank}", self.pack(self.files()))
                return
            if self._is_closed():
                return
            time.sleep(OLD_POLL_SECONDS)

    def _wait_done(self) -> dict | None:
        deadline = time.monotonic() + OLD_WAIT_SECONDS
        while True:
            raw = _present(self.store, "ev/1/done")
            if raw is not None:
                return json.loads(raw)
            if time.monotonic() >= deadline:
                return None
            time.sleep(OLD_POLL_SECONDS)


class OldInitiator:
    """Rank 0 of 50a4304 during one event: its store calls, with its local work as waits."""

    def __init__(self, store: Any, world: int, scope: str, mark: Callable[[str], None]) -> None:
        self.store, self.world, self.scope, self.mark = store, world, scope, mark

    def start(self) -> None:
        from lightning_ncclx.events.doorbell import ring

        self.store.compare_set("ev/1/meta", "", json.dumps({"name": "stall-001", "reason": "stall", "initiator": 0}))
        ring(self.store, range(self.world), "1")  # ring_every_rank: 512 bells per multi_set then too

    def collect(self, deadline: float, digests_seconds: float) -> list[int]:
        """``announce_dumped``, ``wait_for_dumps``, the announcements and digests one by one."""
        self.store.set("ev/1/rank/0", json.dumps({"host": "node-00000", "files": [], "folder": "/d"}))
        self.store.add("ev/1/dumped", 1)
        _present(self.store, f"procs/{self.scope}")
        next_liveness = 0.0
        while time.monotonic() < deadline and int(self.store.add("ev/1/dumped", 0)) < self.world:
            if time.monotonic() >= next_liveness:
                next_liveness = time.monotonic() + 0.5
                _present(self.store, f"procs/{self.scope}")
                _present(self.store, "ev/1/gone")
            time.sleep(0.1)
        self.mark("announce")
        announced = [r for r in range(self.world) if time.monotonic() < deadline and
                     _present(self.store, f"ev/1/rank/{r}") is not None]
        for rank in announced[1:]:
            if time.monotonic() >= deadline:
                break
            _present(self.store, f"ev/1/digest/{rank}")
        time.sleep(digests_seconds)
        self.mark("digests")
        return announced

    def want(self, ranks: list[int], deadline: float) -> None:
        self.store.set("ev/1/want", json.dumps(sorted(ranks)))
        pending = list(ranks)
        while pending and time.monotonic() < deadline:
            pending = [r for r in pending if _present(self.store, f"ev/1/blob/{r}") is None]
            time.sleep(0.1 if pending else 0)

    def close(self, deadline: float) -> None:
        self.store.set("ev/1/meta", json.dumps({"name": "stall-001", "reason": "stall", "initiator": 0,
                                                "closed": True}))
        keys = ["ev/1/dumped", "ev/1/gone", "ev/1/want"]
        for rank in range(self.world):
            keys += [f"ev/1/rank/{rank}", f"ev/1/blob/{rank}", f"ev/1/digest/{rank}"]
        for key in keys:
            if time.monotonic() >= deadline:
                break
            self.store.delete_key(key)

    def done(self, code: int, kind: str | None) -> None:
        self.store.set("ev/1/done", json.dumps({"exit": True, "code": code, "kind": kind, "advice": {}}))

    def leave(self, deadline: float) -> None:
        _present(self.store, f"procs/{self.scope}")
        count = self.store.add("ev/1/leaving", 1)
        end = min(deadline, time.monotonic() + 5.0)  # LEAVE_WAIT_SECONDS, fixed then
        while count < self.world and time.monotonic() < end:
            time.sleep(0.1)
            count = self.store.add("ev/1/leaving", 0)
