"""The values ranks exchange through the store, and their validation.

The job's TCPStore has no authentication: anyone who reaches it can write any key. So every
value read back is checked here before it is used: its size is capped before it is parsed, its
JSON must have the expected shape, numbers must be finite and in range, names must be plain
names. A value that fails raises :class:`BadValue` with the reason; the caller drops that one
entry (and says so in ``collection.json``), never the others.

Example::

    meta = EventMeta.parse(3, raw, world_size=8)         # raises BadValue on a planted value
    ranks = parse_rank_lines(b"0\\n3\\nx\\n", world_size=8)  # ([0, 3], ["line 3: 'x' ..."])
"""

from __future__ import annotations

import json
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable

from lightning_ncclx.dump.digest import COMMON_WORDS
from lightning_ncclx.events.keys import REASONS, event_name, is_event_name, is_safe_name
from lightning_ncclx.layout import rank_prefix

STORE_VALUE_LIMIT = 8 * 1024 * 1024
"""torch's libuv store refuses a value over 8 MiB and closes the sender's connection."""
MAX_META_BYTES = 1024
MAX_HOST_RANKS = 64
"""Ranks of the initiator's host an event's meta lists (it stays under :data:`MAX_META_BYTES`)."""
MAX_HEADER_BYTES = 8 * 1024
MAX_DIGEST_BYTES = 1024 * 1024
MAX_OUTCOME_BYTES = 16 * 1024
MAX_LIST_ENTRIES = 1 << 20
MAX_TEXT_CHARS = 512
MAX_FILES_ANNOUNCED = 64
MAX_ANNOUNCEMENT_BYTES = MAX_HEADER_BYTES + MAX_DIGEST_BYTES + 1
MAX_PID = 1 << 22
"""Linux's largest ``pid_max``."""


class BadValue(ValueError):
    """A store value that is missing, too large or not what the protocol writes there."""


ANNOUNCEMENT_DICTIONARY = "".join(COMMON_WORDS + (
    '"own":[".nccl.fr.pkl",".gloo.fr.pkl",".context.json",".stacks.txt"]', ',"uploaded":true',
    '{"rank":', ',"host":"', '","own":[".nccl.fr.pkl",".context.json",".stacks.txt"],"digest_bytes":',
)).encode()
"""zlib's preset dictionary for announcements that carry a digest: the words every one of them
holds (field names, file names, torch's and Lightning's paths), the header's own skeleton last
(deflate codes a nearer match in fewer bits), so each compresses to what is its own. A value
compressed with another dictionary fails to decompress and is refused."""
COMPRESSED_MARK = b"d"
"""First byte of a compressed announcement (raw deflate follows: no zlib header and checksum, 10
bytes per rank); a plain one starts with ``{``."""


def compress_announcement(plain: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, ANNOUNCEMENT_DICTIONARY)
    return COMPRESSED_MARK + packer.compress(plain) + packer.flush()


def decompress_announcement(raw: bytes, limit: int = MAX_ANNOUNCEMENT_BYTES) -> bytes:
    """The plain announcement of a compressed one, at most ``limit`` bytes of it (a value that
    inflates further is refused before it does: a zlib bomb)."""
    if raw[:1] != COMPRESSED_MARK:
        raise BadValue("compressed announcement: no mark")
    unpacker = zlib.decompressobj(-15, ANNOUNCEMENT_DICTIONARY)
    try:
        plain = unpacker.decompress(raw[1:], limit + 1)
    except zlib.error as error:
        raise BadValue(f"compressed announcement: {str(error)[:80]}") from None
    if len(plain) > limit or unpacker.unconsumed_tail:
        raise BadValue(f"compressed announcement: inflates past the {limit}-byte cap")
    if not unpacker.eof:
        raise BadValue("compressed announcement: truncated")
    if unpacker.unused_data:
        raise BadValue("compressed announcement: bytes after its end")
    return plain


def _decode_json(raw: bytes | str | None, max_bytes: int, what: str) -> Any:
    if raw is None:
        raise BadValue(f"{what}: missing")
    if len(raw) > max_bytes:
        raise BadValue(f"{what}: {len(raw)} bytes, over the {max_bytes}-byte cap")
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
        raise BadValue(f"{what}: not JSON ({type(error).__name__})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def json_object(raw: bytes | str | None, max_bytes: int, what: str) -> dict[str, Any]:
    data = _decode_json(raw, max_bytes, what)
    if not isinstance(data, dict):
        raise BadValue(f"{what}: a JSON {type(data).__name__} where an object belongs")
    return data


def as_int(value: Any, what: str, low: int, high: int) -> int:
    """An int in ``[low, high)``; bools, floats and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise BadValue(f"{what}: {_show(value)} is not an integer in [{low}, {high})")
    return value


def as_finite(value: Any, what: str, low: float = 0.0, high: float = 1e9) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadValue(f"{what}: {_show(value)} is not a number")
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise BadValue(f"{what}: {_show(value)} is not a finite number in [{low}, {high}]")
    return number


def as_text(value: Any, what: str, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        raise BadValue(f"{what}: {_show(value)} is not a string")
    return value[:limit]


def as_safe_name(value: Any, what: str) -> str:
    if not is_safe_name(value):
        raise BadValue(f"{what}: {_show(value)} is not a plain name")
    return str(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class EventMeta:
    """``ev/<n>/meta``: which event this is, who started it and whether it is over."""

    number: int
    name: str
    reason: str
    initiator: int
    opened: float | None = None
    """The initiator's wall clock when it proposed the event (unix seconds)."""
    closed: bool = False
    alone: bool = False
    """The initiator runs on the host that serves the job's store (its own process, or its host's
    launcher agent, which closes the store only once its ranks are gone) and no other rank shares
    that host: once the store is gone, the initiator is gone too and no rank of its host can send
    its alert."""
    store_host: bool = False
    """The initiator runs on the host that serves the job's store (its own process or its host's
    launcher agent): a store that stops answering may mean that host is lost, with the initiator."""
    host_ranks: tuple[int, ...] = ()
    """With ``store_host``: the other ranks registered on the initiator's host when the event
    started (at most :data:`MAX_HOST_RANKS`; more are not listed), lost with it if it is."""

    @classmethod
    def new(cls, number: int, reason: str, initiator: int, opened: float, name: str | None = None, *,
            alone: bool = False, store_host: bool = False, host_ranks: tuple[int, ...] = ()) -> "EventMeta":
        listed = tuple(sorted(host_ranks))[:MAX_HOST_RANKS] if store_host else ()
        return cls(number, name or event_name(reason, number, initiator), reason, initiator, round(opened, 3),
                   alone=alone, store_host=store_host, host_ranks=listed)

    def to_json(self, closed: bool | None = None) -> str:
        data: dict[str, Any] = {"name": self.name, "reason": self.reason, "initiator": self.initiator}
        if self.opened is not None:
            data["opened"] = round(self.opened, 3)
        if self.closed if closed is None else closed:
            data["closed"] = True
        if self.alone:
            data["alone"] = True
        if self.store_host:
            data["store_host"] = True
            data["host_ranks"] = list(self.host_ranks)
        return json.dumps(data)

    @classmethod
    def parse(cls, number: int, raw: bytes | str | None, world_size: int) -> "EventMeta":
        data = json_object(raw, MAX_META_BYTES, f"event {number}'s meta")
        reason = data.get("reason")
        if reason not in REASONS:
            raise BadValue(f"event {number}'s meta: reason {_show(reason)} is not one of {', '.join(REASONS)}")
        initiator = as_int(data.get("initiator"), f"event {number}'s initiator", 0, world_size)
        name = data.get("name")
        if not is_event_name(name, reason, number, initiator):
            raise BadValue(f"event {number}'s meta: name {_show(name)} is not an event name of this protocol")
        opened = data.get("opened")
        store_host = data.get("store_host") is True
        return cls(number, name, reason, initiator,
                   None if opened is None else as_finite(opened, f"event {number}'s opening time", 0.0, 1e11),
                   data.get("closed") is True, alone=data.get("alone") is True, store_host=store_host,
                   host_ranks=_host_ranks(data.get("host_ranks"), world_size) if store_host else ())


def _host_ranks(value: Any, world_size: int) -> tuple[int, ...]:
    """A meta's ``host_ranks``: a list of at most :data:`MAX_HOST_RANKS` ranks of the job, else
    none (it only names ranks that cannot send an alert: a wrong list costs no event)."""
    if not isinstance(value, list) or len(value) > MAX_HOST_RANKS:
        return ()
    if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world_size for r in value):
        return ()
    return tuple(sorted(set(value)))


@dataclass(frozen=True)
class Announcement:
    """``ev/<n>/rank/<r>``: where rank ``r``'s dump is, and its digest in a two-phase gather.

    One value per rank (a JSON header line, then the digest's bytes), so that the initiator
    reads many ranks in one ``multi_get``; with a digest the whole value is deflated with
    :data:`ANNOUNCEMENT_DICTIONARY` (it then starts with :data:`COMPRESSED_MARK`, a plain one with
    ``{``) and carries no ``folder`` (read back as ``""``)."""

    rank: int
    host: str
    files: tuple[str, ...]
    folder: str
    """Where the rank wrote its dump, on its own host (in its own log lines; never opened by
    another rank)."""
    digest: bytes | None = None
    uploaded: bool = False
    """The whole dump is in the store too (``ev/<n>/blob/<r>``)."""

    def encode(self) -> bytes:
        """Plain JSON without a digest; with one, a compact header (no ``folder``: only this rank
        shows it; the rank's own file names as their suffixes) and the digest, compressed."""
        if self.digest is None:
            header: dict[str, Any] = {"rank": self.rank, "host": self.host, "files": list(self.files),
                                      "folder": self.folder, "uploaded": self.uploaded}
            return json.dumps(header).encode()
        prefix = rank_prefix(self.rank) + "."
        own = [n[len(prefix) - 1:] for n in self.files if n.startswith(prefix)]
        header = {"rank": self.rank, "host": self.host}
        others = [n for n in self.files if not n.startswith(prefix)]
        if others:
            header["files"] = others
        header["own"] = own
        if self.uploaded:
            header["uploaded"] = True
        header["digest_bytes"] = len(self.digest)
        plain = json.dumps(header, separators=(",", ":")).encode() + b"\n" + self.digest
        return compress_announcement(plain)

    @classmethod
    def parse(cls, rank: int, raw: bytes | None) -> "Announcement":
        if raw is None:
            raise BadValue(f"rank {rank}'s announcement: missing")
        if len(raw) > MAX_ANNOUNCEMENT_BYTES:
            raise BadValue(f"rank {rank}'s announcement: {len(raw)} bytes, over the cap")
        if raw[:1] == COMPRESSED_MARK:
            try:
                raw = decompress_announcement(raw)
            except BadValue as error:
                raise BadValue(f"rank {rank}'s announcement: {error}") from None
        head, newline, payload = raw.partition(b"\n")
        data = json_object(head, MAX_HEADER_BYTES, f"rank {rank}'s announcement")
        if data.get("rank") != rank:
            raise BadValue(f"rank {rank}'s announcement names rank {_show(data.get('rank'))}")
        files, own = data.get("files", []), data.get("own", [])
        for listed, key in ((files, "files"), (own, "own")):
            if not isinstance(listed, list) or len(listed) > MAX_FILES_ANNOUNCED:
                raise BadValue(f"rank {rank}'s announcement: {key} {_show(listed)} is not a short list")
        own_names = [f"{rank_prefix(rank)}{s}" if isinstance(s, str) and s.startswith(".") else s for s in own]
        names = tuple(as_safe_name(f, f"rank {rank}'s file name") for f in [*files, *own_names])
        digest_bytes = data.get("digest_bytes")
        digest = None
        if digest_bytes is not None:
            size = as_int(digest_bytes, f"rank {rank}'s digest size", 0, MAX_DIGEST_BYTES + 1)
            if not newline or len(payload) != size:
                raise BadValue(f"rank {rank}'s announcement: digest of {len(payload)} bytes, {size} announced")
            digest = payload
        return cls(rank, as_safe_name(data.get("host"), f"rank {rank}'s host"), names,
                   as_text(data.get("folder", ""), f"rank {rank}'s folder", 4096), digest, data.get("uploaded") is True)


_RANK_LINE = re.compile(rb"^[ \t\r\f\v]*([0-9]{1,9})[ \t\r\f\v]*$", re.MULTILINE)


def parse_rank_lines(raw: bytes | None, world_size: int, what: str = "ranks") -> tuple[list[int], list[str]]:
    """Rank numbers, one per line (``roster``, ``gone``); bad lines are left out and described."""
    if not raw:
        return [], []
    if len(raw) > 16 * (world_size + 64) + 4096:  # planted lines around the honest ones: read without a loop per line
        found = dict.fromkeys(map(int, dict.fromkeys(_RANK_LINE.findall(raw))))
        return [r for r in found if r < world_size], [f"{what}: {len(raw)} bytes for {world_size} ranks, over the "
                                                      "cap: only its lines that name a rank of this job were read"]
    ranks: dict[int, None] = {}
    notes: list[str] = []
    for number, line in enumerate(raw.split(b"\n"), 1):
        text = line.strip()
        if not text:
            continue
        if text.isdigit() and len(text) <= 9 and int(text) < world_size:
            ranks[int(text)] = None
        elif len(notes) < 8:
            notes.append(f"{what}, line {number}: {_show(text[:40])} is not a rank of this job")
    return list(ranks), notes


def parse_rank_list(raw: bytes | None, world_size: int, what: str) -> list[int]:
    """A JSON list of distinct ranks (``want``)."""
    data = _decode_json(raw, 16 * (world_size + 64) + 4096, what)
    if not isinstance(data, list) or len(data) > world_size:
        raise BadValue(f"{what}: {_show(data)} is not a list of at most {world_size} ranks")
    return sorted({as_int(r, f"{what} entry", 0, world_size) for r in data})


@dataclass(frozen=True)
class Outcome:
    """``ev/<n>/outcome``: the initiator's last word on an event."""

    recovered: bool = False
    lasted_seconds: float | None = None
    """Recovered: from the heartbeat the event was about to the last rank moving on."""
    exit: bool = False
    code: int | None = None
    kind: str | None = None
    advice: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        data: dict[str, Any] = {"recovered": self.recovered, "exit": self.exit}
        if self.lasted_seconds is not None:
            data["lasted_seconds"] = round(self.lasted_seconds, 3)
        if self.exit:
            data.update(code=self.code, kind=self.kind, advice=self.advice)
        return json.dumps(data, default=str)

    @classmethod
    def parse(cls, raw: bytes | None, allowed_codes: Iterable[int], kinds: Iterable[str]) -> "Outcome":
        data = json_object(raw, MAX_OUTCOME_BYTES, "event outcome")
        recovered = data.get("recovered") is True
        leave = data.get("exit") is True
        if recovered == leave:
            raise BadValue("event outcome: neither recovered nor an exit (or both)")
        if recovered:
            lasted = data.get("lasted_seconds")
            return cls(recovered=True, lasted_seconds=None if lasted is None else as_finite(
                lasted, "recovered event's duration", 0.0, 1e7))
        allowed = sorted(set(allowed_codes))
        code = data.get("code")
        if isinstance(code, bool) or code not in allowed:
            raise BadValue(f"event outcome: exit code {_show(code)} is none this job's config gives ({allowed})")
        kind = data.get("kind")
        if kind is not None and kind not in set(kinds):
            raise BadValue(f"event outcome: {_show(kind)} is not a hang kind")
        return cls(exit=True, code=code, kind=kind, advice=_advice(data.get("advice")))


def _advice(value: Any) -> dict[str, Any]:
    """The restart advice, cut down to its known fields with plain values."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, Any] = {}
    if isinstance(value.get("action"), str):
        out["action"] = value["action"][:64]
    if isinstance(value.get("reason"), str):
        out["reason"] = value["reason"][:MAX_TEXT_CHARS]
    hosts = value.get("hosts_to_exclude")
    if isinstance(hosts, list):
        out["hosts_to_exclude"] = [h for h in hosts[:64] if is_safe_name(h)]
    return out
