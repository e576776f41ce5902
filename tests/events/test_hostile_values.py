"""Planted store values against the event protocol, on a real ``TCPStore`` with a second
client writing what anyone who reaches the port can write (:mod:`hostile_store`). Each test
names the defect it guards: a value that would have been trusted, now refused or bounded."""

from __future__ import annotations

import dataclasses

import json
import random
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from hostile_payloads import (
    NOT_AN_OBJECT, escaping_names, gzip_bomb, incompressible_bytes, json_with, random_values, xz_bomb,
)
from hostile_store import PLUGIN_PREFIX, HostileStore
from lightning_ncclx.config import HANG_KINDS
from lightning_ncclx.events.connection import StoreAddress, StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.gather import gather_and_summarize
from lightning_ncclx.events.keys import rank_key
from lightning_ncclx.events.packing import CHUNK_BYTES, pack_files, put_blob
from lightning_ncclx.events.wire import Announcement, EventMeta
from lightning_ncclx.events.liveness import ProcessInfo, this_process


@pytest.fixture
def server() -> Iterator[Any]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield store


@pytest.fixture
def hostile(server: Any) -> Iterator[HostileStore]:
    with HostileStore("127.0.0.1", server.port, prefix=PLUGIN_PREFIX, timeout_seconds=30) as client:
        yield client


def rank_client(server: Any) -> StoreClient:
    return StoreClient(opener=StoreAddress("127.0.0.1", server.port).connect, op_timeout_seconds=0.5)


def coordinator(server: Any, rank: int, world: int) -> EventCoordinator:
    return EventCoordinator(rank_client(server), rank, world)


def files_of(folder: Path, rank: int, payload: bytes = b"\x80\x04N.") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, data in ((f"rank_{rank:05d}.context.json", json.dumps({"rank": rank}).encode()),
                       (f"rank_{rank:05d}.gloo.fr.pkl", payload)):
        (folder / name).write_bytes(data)
        out.append(folder / name)
    return out


def everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ---------------------------------------------------------------------------------- event names
def test_a_planted_event_name_that_leaves_the_dump_folder_is_never_joined(server: Any, hostile: HostileStore,
                                                                          tmp_path: Path) -> None:
    """Defect: ``ev/<n>/meta``'s ``name`` became a folder unchecked (``..``, absolute)."""
    dump_dir = tmp_path / "sandbox" / "dumps"
    names = escaping_names(dump_dir, tmp_path / "sandbox" / "escaped") + ["stall-001/../../x", "ondemand-001\n"]
    for number, name in enumerate(names, 1):
        hostile.set(f"ev/{number}/meta", json.dumps({"name": name, "reason": "on_demand", "initiator": 0}))
    rank = coordinator(server, 1, 2)
    assert rank.poll() is None  # every planted number stepped past, none joined
    assert rank.last_seen == len(names) and len(rank.refused) == len(names)
    own = rank.propose("stall")
    assert own is not None and (own.number, own.name, own.initiator) == (len(names) + 1, f"stall-{len(names) + 1:03d}", 1)


@pytest.mark.parametrize("field,raw", [("initiator", "7"), ("initiator", "-1"), ("initiator", "1e999"),
                                       ("initiator", "NaN"), ("initiator", '"0"'), ("reason", '"rm -rf"'),
                                       ("opened", "Infinity"), ("name", '"stall-002"')])
def test_a_meta_with_a_field_out_of_range_takes_nothing(server: Any, hostile: HostileStore, field: str,
                                                        raw: str) -> None:
    """Defects: ``initiator`` trusted (a rank outside the job, ``int("1e999")``), a name that does
    not belong to its number."""
    hostile.set("ev/1/meta", json_with({"name": "stall-001", "reason": "stall", "initiator": 0}, field, raw))
    rank = coordinator(server, 1, 2)
    assert rank.poll() is None and rank.refused


@pytest.mark.parametrize("raw", NOT_AN_OBJECT)
def test_a_meta_that_is_no_object_is_stepped_past(server: Any, hostile: HostileStore, raw: str) -> None:
    hostile.set("ev/1/meta", raw)
    rank = coordinator(server, 0, 2)
    assert rank.poll() is None
    assert rank.propose("stall").number == 2


# ---------------------------------------------------------------------------------- stale events
def test_a_rank_behind_on_events_starts_its_own_instead_of_joining_a_closed_one(server: Any) -> None:
    """Defect: a rank whose counter was behind (a lost ring) joined an old, closed event and
    dumped into its folder; no summary followed."""
    first, late = coordinator(server, 0, 2), coordinator(server, 1, 2)
    for _ in range(3):
        event = first.propose("on_demand")
        first.close(event, {}, [])
    assert late.last_seen == 0
    own = late.propose("stall")
    assert (own.number, own.initiator) == (4, 1)


def test_an_open_event_whose_initiator_vanished_long_ago_is_not_joined(server: Any, hostile: HostileStore) -> None:
    hostile.set("ev/1/meta", json.dumps({"name": "stall-001", "reason": "stall", "initiator": 0, "opened": 1000.0}))
    rank = coordinator(server, 1, 2)
    assert rank.poll() is None
    assert rank.propose("stall").number == 2


# ---------------------------------------------------------------------------------- the gather
def _announce(rank: EventCoordinator, event: EventMeta, host: str, folder: Path, upload: bool = True) -> None:
    files = files_of(folder, rank.rank)
    rank.announce(event, Announcement(rank.rank, host, tuple(p.name for p in files), str(folder)),
                  files if upload else None)


def _written_for(dump_dir: Path, rank: int) -> list[Path]:
    """The files of ``rank`` the gather wrote under ``dump_dir`` (into its host's folder)."""
    return sorted(dump_dir.rglob(f"ranks/*/rank_{rank:05d}.*"))


def _summarize(initiator: EventCoordinator, event: EventMeta, dump_dir: Path):
    folder = dump_dir / event.name
    files_of(folder, initiator.rank)
    initiator.announce(event, Announcement(initiator.rank, "node-0", (), str(folder)))
    result = gather_and_summarize(initiator, event, folder, dump_dir=dump_dir, collect_timeout_seconds=2.0,
                                  gather_through_store=True)
    if result.reports_writer is not None:  # the reports after summary.json come from a thread: the folder settles
        assert result.reports_writer.join(60.0)
    return result


@pytest.mark.parametrize("raw", NOT_AN_OBJECT + ['{"rank": 2, "host": "..", "files": [], "folder": ""}',
                                                 '{"rank": 2, "host": "/etc", "files": [], "folder": ""}',
                                                 '{"rank": 2, "host": "ok", "files": ["../x"], "folder": ""}',
                                                 '{"rank": 2, "host": "ok", "files": {}, "folder": ""}'])
def test_one_bad_announcement_costs_only_its_own_rank(server: Any, hostile: HostileStore, tmp_path: Path,
                                                      raw: str) -> None:
    """Defects: a non-JSON announcement marked every other rank missing; a list where an object
    belongs raised out of the initiator's summary (so the event never closed); a host ``..``
    became a folder."""
    dump_dir = tmp_path / "sandbox" / "dumps"
    ranks = [coordinator(server, r, 3) for r in range(3)]
    event = ranks[0].propose("stall")
    _announce(ranks[1], event, "node-1", tmp_path / "node-1" / event.name)
    hostile.set(f"ev/{event.number}/rank/2", raw)
    hostile.append(f"ev/{event.number}/dumped", "2\n")
    result = _summarize(ranks[0], event, dump_dir)
    assert result.dumped_ranks == [0, 1] and result.missing_ranks == [2]
    assert result.gathered == {1: str(dump_dir / event.name / "ranks" / "node-1")}
    assert _written_for(dump_dir, 1) and not _written_for(dump_dir, 2)  # the check the million-chunk test relies on
    assert any("rank 2" in line for line in result.refused)
    collection = json.loads((dump_dir / event.name / "collection.json").read_text())
    assert collection["refused"] == result.refused and collection["dumped_ranks"] == [0, 1]
    assert everything_under(tmp_path / "sandbox") <= {"dumps"} | {f"dumps/{p}" for p in everything_under(dump_dir)}


@pytest.mark.parametrize("make_bomb", [gzip_bomb, xz_bomb], ids=["gzip", "xz"])
def test_a_compressed_bomb_is_refused_at_its_first_member_without_inflating_it(make_bomb: Any, tmp_path: Path) -> None:
    """Defect: a gathered blob's members were read whole, uncapped (a 1 MB blob became a 1 GiB
    file and 1 GiB of memory). The summarizing process stays small."""
    bomb = make_bomb(1 << 30, member_name="rank_00001.context.json")
    code = f"""
import json, resource, sys
sys.path[:0] = {sys.path!r}
from pathlib import Path
from lightning_ncclx.events.packing import unpack
def peak_mib():  # this process's own high-water mark (ru_maxrss keeps the launching process's across exec)
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024
before = peak_mib()
out = unpack(Path(sys.argv[1]).read_bytes(), Path(sys.argv[2]) / "ranks" / "h", inside=Path(sys.argv[2]))
print(json.dumps({{"written": [str(p) for p in out.written], "refused": out.refused,
                  "grew_mib": peak_mib() - before}}))
"""
    (tmp_path / "bomb.tgz").write_bytes(bomb)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bomb.tgz"), str(tmp_path / "dumps")],
                          capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(done.stdout)
    assert report["written"] == [] and "over the cap" in report["refused"][0]
    assert report["grew_mib"] < 64, report
    assert sum(p.stat().st_size for p in (tmp_path / "dumps").rglob("*") if p.is_file()) == 0


def test_an_xz_blob_that_asks_for_a_4_gib_dictionary_is_refused_before_it_is_allocated(tmp_path: Path) -> None:
    code = f"""
import json, resource, sys
sys.path[:0] = {sys.path!r}
from pathlib import Path
from hostile_payloads import xz_declaring_a_huge_dictionary
from lightning_ncclx.events.packing import unpack
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))  # a 4 GiB reservation would fail loudly
out = unpack(xz_declaring_a_huge_dictionary(), Path(sys.argv[1]) / "ranks" / "h", inside=Path(sys.argv[1]))
print(json.dumps({{"written": [str(p) for p in out.written], "refused": out.refused}}))
"""
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dumps")], capture_output=True, text=True,
                          timeout=120, check=True)
    report = json.loads(done.stdout)
    assert report["written"] == [] and report["refused"] == ["archive unreadable after 0 file(s): LZMAError"]


def test_a_blob_that_names_a_million_chunks_is_refused(server: Any, hostile: HostileStore, tmp_path: Path) -> None:
    ranks = [coordinator(server, r, 2) for r in range(2)]
    event = ranks[0].propose("stall")
    _announce(ranks[1], event, "node-1", tmp_path / "node-1" / event.name, upload=False)
    hostile.set(f"ev/{event.number}/blob/1", json.dumps({"chunks": 1_000_000, "bytes": 1 << 40}))
    result = _summarize(ranks[0], event, tmp_path / "dumps")
    assert result.gathered == {}, result.gathered  # rank 1 not gathered (a sound blob gathers it: {1: folder})
    assert _written_for(tmp_path / "dumps", 1) == []
    assert any("rank 1's dump chunks: 1000000 is not an integer" in line for line in result.refused), result.refused


def test_a_dump_over_the_store_value_limit_travels_in_chunks_and_the_connection_survives(
        server: Any, tmp_path: Path) -> None:
    """Defect: a packed dump over 8 MiB was sent as one value; torch's store refused it and closed
    the rank's connection for the rest of the run (its dump never announced, polling stopped)."""
    ranks = [coordinator(server, r, 2) for r in range(2)]
    event = ranks[0].propose("stall")
    big = incompressible_bytes(9 * 1024 * 1024)
    _announce(ranks[1], event, "node-1", tmp_path / "node-1" / event.name)
    files = files_of(tmp_path / "node-1b" / event.name, 1, payload=big)
    assert put_blob(ranks[1].client, event.number, 1, pack_files(files))  # over 8 MiB: 3 chunks of <= 4 MiB
    assert ranks[1].client.read(f"ev/{event.number}/blob/1/2") is not None
    assert ranks[1].client.add("still-connected", 1) == 1 and ranks[1].client.reconnects == 0
    result = _summarize(ranks[0], event, tmp_path / "dumps")
    gathered = Path(result.gathered[1]) / "rank_00001.gloo.fr.pkl"
    assert gathered.read_bytes() == big and result.refused == []
    assert CHUNK_BYTES < 8 * 1024 * 1024


def test_a_lost_connection_is_reopened(server: Any, hostile: HostileStore) -> None:
    client = rank_client(server)
    client.set("k", "v")
    try:
        client.raw.set("too-big", b"x" * (9 * 1024 * 1024))  # the server refuses it and closes this connection
    except Exception:  # noqa: BLE001 - that is the point
        pass
    assert client.read("k") == b"v" and client.reconnects == 1


# ---------------------------------------------------------------------------------- reads never wait
def test_reads_of_keys_another_client_deletes_return_at_once(server: Any, hostile: HostileStore) -> None:
    """Defect: ``check`` then ``get``/``multi_get`` blocked for the store's timeout (30 min under
    Lightning) when another client deleted the key in between."""
    client = rank_client(server)
    hostile.set("cs/rank/0", "x")
    assert client.read("cs/rank/1") is None
    assert client.read_many(["cs/rank/0", "cs/rank/1", "cs/rank/2"]) == [b"x", None, None]
    assert client.multi_get(["cs/rank/0", "cs/rank/1"]) == [b"x", b""]


# ---------------------------------------------------------------------------------- want, outcome
@pytest.mark.parametrize("raw", ['"1"', "[1, 1e999]", "[-1]", "[99]", '{"1": true}', "[" + "1," * 10 + "1]", "nul"])
def test_a_planted_want_is_refused(server: Any, hostile: HostileStore, raw: str) -> None:
    rank = coordinator(server, 1, 2)
    event = coordinator(server, 0, 2).propose("stall")
    hostile.set(f"ev/{event.number}/want", raw)
    assert rank.wanted(event) is None and rank.refused


@pytest.mark.parametrize("raw", ['{"exit": true, "code": 0}', '{"exit": true, "code": 137}', '{"exit": true, "code": 1e999}',
                                 '{"exit": true, "code": "75"}', '{"exit": true, "code": true}',
                                 '{"exit": true, "recovered": true, "code": 75}', '{"recovered": true, "lasted_seconds": NaN}',
                                 '{"exit": true, "code": 75, "kind": "../../x"}', "[]"])
def test_an_exit_order_with_a_status_the_config_cannot_give_is_refused(server: Any, hostile: HostileStore,
                                                                       raw: str) -> None:
    """Defect: the ``done`` exit code was trusted (any status, any type)."""
    rank = coordinator(server, 1, 2)
    event = coordinator(server, 0, 2).propose("stall")
    hostile.set(f"ev/{event.number}/outcome", raw)
    assert rank.outcome(event, {75, 76}, HANG_KINDS) is None and rank.refused


def test_the_advice_of_an_exit_order_is_cut_to_plain_fields(server: Any, hostile: HostileStore) -> None:
    rank = coordinator(server, 1, 2)
    event = coordinator(server, 0, 2).propose("stall")
    hostile.set(f"ev/{event.number}/outcome", json.dumps({
        "exit": True, "code": 76, "kind": "program_divergence",
        "advice": {"action": "x" * 1000, "hosts_to_exclude": ["ok-host", "../..", "/etc", 7], "extra": [1] * 99}}))
    outcome = rank.outcome(event, {75, 76}, HANG_KINDS)
    assert outcome is not None and outcome.code == 76
    assert outcome.advice == {"action": "x" * 64, "hosts_to_exclude": ["ok-host"]}


# ---------------------------------------------------------------------------------- liveness
def test_planted_process_lines_never_make_a_rank_check_another_pid(server: Any, hostile: HostileStore) -> None:
    """Defect: ``procs/`` lines were trusted (a pid of 1, a string, a rank outside the job)."""
    me = this_process(0)
    assert me is not None
    rank = coordinator(server, 0, 3)
    rank.register_process(me)
    key = f"procs/{me.scope}"
    for line in ('{"rank": 1, "host": "h", "pid": "1", "start_ticks": 1, "scope": "%s"}',
                 '{"rank": 9, "host": "h", "pid": 1, "start_ticks": 1, "scope": "%s"}',
                 '{"rank": 1, "host": "..", "pid": 1, "start_ticks": 1, "scope": "%s"}',
                 '{"rank": 1, "host": "h", "pid": 1e999, "start_ticks": 1, "scope": "%s"}',
                 '{"rank": 1, "host": "h", "pid": -5, "start_ticks": 1, "scope": "%s"}', "not json", "[]"):
        hostile.append(key, (line % me.scope if "%s" in line else line) + "\n")
    hostile.append(key, ProcessInfo(2, me.host, me.pid, me.start_ticks, me.scope).to_json() + "\n")  # alive
    event = rank.propose("stall")
    assert rank.check_local_peers(event) == set()
    assert sorted(rank.local.peers()) == [2]


def test_planted_gone_lines_name_only_ranks_of_the_job(server: Any, hostile: HostileStore) -> None:
    rank = coordinator(server, 0, 3)
    event = rank.propose("stall")
    hostile.append(f"ev/{event.number}/gone", "1\n-1\n99\nabc\n1e999\n" + "2" * 40 + "\n")
    assert rank.gone_ranks(event) == {1}


# ---------------------------------------------------------------------------------- random values
def test_an_overwritten_roster_hides_no_rank(server: Any, hostile: HostileStore, tmp_path: Path) -> None:
    ranks = [coordinator(server, r, 3) for r in range(3)]
    event = ranks[0].propose("stall")
    for r in (1, 2):
        _announce(ranks[r], event, f"node-{r}", tmp_path / f"node-{r}" / event.name)
    hostile.set(f"ev/{event.number}/dumped", "x\n../2\n")
    assert sorted(ranks[0].announced(event)) == [1, 2]


def test_random_values_under_every_key_of_an_event_never_raise_out_of_the_summary(server: Any, hostile: HostileStore,
                                                                                  tmp_path: Path) -> None:
    rng = random.Random(26)
    dump_dir = tmp_path / "sandbox" / "dumps"
    for round_ in range(6):
        ranks = [coordinator(server, r, 3) for r in range(3)]
        for r in ranks:
            r.skip_past_events()
        event = ranks[0].propose("stall")
        _announce(ranks[1], event, "node-1", tmp_path / f"node-1-{round_}" / event.name)
        values = random_values(rng, 16, max_bytes=4096)
        for leaf in ("rank/2", "blob/2", "blob/2/0", "dumped", "moved", "gone", "want", "outcome", "rank/1"):
            try:
                hostile.set(f"ev/{event.number}/{leaf}", next(values))
            except Exception:  # noqa: BLE001 - a counter key holds an int: the store refuses some writes
                pass
        result = _summarize(ranks[0], event, dump_dir)
        ranks[0].close(event, result.announced, result.blobs_from)
        assert 0 in result.dumped_ranks
    assert {p.split("/")[0] for p in everything_under(tmp_path / "sandbox")} == {"dumps"}


def test_announcement_round_trip_keeps_the_digest(server: Any) -> None:
    rank = coordinator(server, 1, 2)
    event = coordinator(server, 0, 2).propose("stall")
    sent = Announcement(1, "node-1", ("rank_00001.context.json",), "/d", b"\x00digest\n\xff")
    rank.announce(event, sent)
    raw = rank.client.read(rank_key(event.number, 1))
    assert Announcement.parse(1, raw) == dataclasses.replace(sent, folder="")  # a digest's carries no folder


def test_an_events_alone_mark_is_read_only_as_the_json_true() -> None:
    """``alone`` (the initiator ran alone on the store's host) is true only where the meta
    says exactly ``true``: anything else reads as not alone (no watcher then sends on its own)."""
    from lightning_ncclx.events.wire import EventMeta

    meta = EventMeta.new(3, "stall", 0, 1.7e9, alone=True)
    assert EventMeta.parse(3, meta.to_json(), 4).alone
    assert EventMeta.parse(3, meta.to_json(closed=True), 4).alone
    for planted in ('"yes"', "1", "null", '{"a": 1}'):
        raw = meta.to_json().replace('"alone": true', f'"alone": {planted}')
        assert not EventMeta.parse(3, raw, 4).alone, raw
    assert '"alone"' not in EventMeta.new(3, "stall", 0, 1.7e9).to_json()


def test_an_events_store_host_mark_and_its_host_ranks_are_read_only_as_written() -> None:
    """``store_host`` (the initiator ran on the store's host) is true only where the meta says
    exactly ``true``; its ``host_ranks`` only as a list of at most 64 ranks of the job, else none
    (they only name ranks that cannot send an alert: a planted list costs no event)."""
    from lightning_ncclx.events.wire import MAX_HOST_RANKS, MAX_META_BYTES, EventMeta

    meta = EventMeta.new(3, "stall", 0, 1.7e9, store_host=True, host_ranks=(2, 1))
    parsed = EventMeta.parse(3, meta.to_json(), 4)
    assert parsed == meta and parsed.store_host and parsed.host_ranks == (1, 2)
    assert EventMeta.parse(3, meta.to_json(closed=True), 4).host_ranks == (1, 2)
    for planted in ('"yes"', "1", "null", '{"a": 1}'):
        raw = meta.to_json().replace('"store_host": true', f'"store_host": {planted}')
        assert not EventMeta.parse(3, raw, 4).store_host and not EventMeta.parse(3, raw, 4).host_ranks, raw
    for planted in ('"1,2"', "[1, 9]", "[-1]", "[true]", "[1.0]", "null", str(list(range(65)))):
        raw = meta.to_json().replace('"host_ranks": [1, 2]', f'"host_ranks": {planted}')
        assert EventMeta.parse(3, raw, 100 if planted.startswith("[0") else 4).host_ranks == (), raw
    big = EventMeta.new(3, "stall", 16_000, 1.7e9, store_host=True, host_ranks=tuple(range(16_300, 16_384)))
    assert len(big.host_ranks) == MAX_HOST_RANKS and len(big.to_json()) <= MAX_META_BYTES
    assert EventMeta.parse(3, big.to_json(), 16_384) == big
    assert '"store_host"' not in EventMeta.new(3, "stall", 0, 1.7e9, host_ranks=(1,)).to_json()
