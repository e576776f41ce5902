"""The store protocol of dump events, on an in-memory store with an injected clock: agreeing on
one event, catching up past events that are over, announcements and their gather, liveness."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.coordinator import SILENT_RANK_GRACE_SECONDS, EventCoordinator
from lightning_ncclx.events.gather import CollectionResult, gather_and_summarize, gather_missing
from lightning_ncclx.events.packing import pack_files, unpack
from lightning_ncclx.events.wire import Announcement, EventMeta
from support import FakeClock


def coordinators(world: int, clock: FakeClock | None = None, wall: FakeClock | None = None) -> list[EventCoordinator]:
    client = StoreClient(dist.PrefixStore("test", dist.HashStore()))
    kwargs = {"clock": clock, "sleep": clock.sleep} if clock else {}
    if wall is not None:
        kwargs["wall_clock"] = wall
    return [EventCoordinator(client, r, world, **kwargs) for r in range(world)]


def announce(coordinator: EventCoordinator, event: EventMeta, host: str, files: list[Path], folder: Path,
             upload: bool = False) -> None:
    announcement = Announcement(coordinator.rank, host, tuple(p.name for p in files), str(folder))
    coordinator.announce(event, announcement, files if upload else None)


def test_concurrent_proposers_agree_on_one_event_and_initiator() -> None:
    ranks = coordinators(4)
    results = [None] * 4
    barrier = threading.Barrier(4)

    def propose(r: int) -> None:
        barrier.wait()
        results[r] = ranks[r].propose("stall")

    threads = [threading.Thread(target=propose, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({(e.number, e.name, e.initiator) for e in results}) == 1
    assert results[0].name == "stall-001"


def test_a_rank_that_saw_the_event_proposes_the_next_one() -> None:
    a, b, c = coordinators(3)
    first = b.propose("stall")
    assert a.poll() == first and c.poll() == first
    assert a.poll() is None
    second = c.propose("on_demand")
    assert (second.number, second.name, second.initiator) == (2, "ondemand-002", 2)
    assert a.poll() == second
    joined = b.propose("exception")  # b had not seen event 2: it gets c's event back and joins it
    assert (joined.name, joined.initiator) == ("ondemand-002", 2)
    assert b.propose("exception").name == "exception-rank1-003"


def test_a_new_watchdog_on_the_same_store_starts_after_the_earlier_events() -> None:
    first_run = coordinators(2)
    first = first_run[0].propose("on_demand")
    assert first_run[1].poll() is not None
    second = first_run[1].propose("stall")
    assert second.number == 2
    first_run[0].close(first, {}, [])  # summarized: the initiators mark their events closed
    first_run[1].close(second, {}, [])
    store = first_run[0].client
    later = EventCoordinator(store, 1, 2)  # trainer.validate after fit: same store, new watchdog
    assert later.skip_past_events() == 2
    assert later.poll() is None
    other = EventCoordinator(store, 0, 2)
    other.skip_past_events()
    assert other.propose("stall").number == 3
    assert later.poll().number == 3


def test_wait_for_dumps_names_what_arrived_by_the_deadline(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    r0, r1, r2 = coordinators(3, clock)
    event = r0.propose("stall")
    for rank in (r0, r2):
        announce(rank, event, "host-a", [], tmp_path)
    found = r0.wait_for_dumps(event, timeout_seconds=5.0)
    assert sorted(found) == [0, 2] and clock.now >= 5.0


def test_a_rank_found_silent_is_waited_for_only_a_grace_after_the_others(tmp_path: Path) -> None:
    """The detection found rank 1's watchdog unable to run: once ranks 0 and 2 dumped, rank 1 is
    waited for ``SILENT_RANK_GRACE_SECONDS`` more, not the whole collection timeout."""
    clock = FakeClock(0.0)
    r0, r1, r2 = coordinators(3, clock)
    event = r0.propose("stall")
    for rank in (r0, r2):
        announce(rank, event, "host-a", [], tmp_path)
    found = r0.wait_for_dumps(event, timeout_seconds=20.0, silent_ranks=frozenset({1}))
    assert sorted(found) == [0, 2]
    assert SILENT_RANK_GRACE_SECONDS <= clock.now < SILENT_RANK_GRACE_SECONDS + 1.0


def test_files_travel_through_the_store_to_ranks_host(tmp_path: Path) -> None:
    node_a, node_b = tmp_path / "a" / "stall-001", tmp_path / "b" / "stall-001"
    node_b.mkdir(parents=True)
    files = []
    for name, data in (("rank_00001.context.json", b"{}"), ("rank_00001.gloo.fr.pkl", b"\x80\x04N.")):
        path = node_b / name
        path.write_bytes(data)
        files.append(path)
    r0, r1 = coordinators(2)
    event = r0.propose("stall")
    r1.poll()
    announce(r1, event, "node-b", files, node_b, upload=True)
    announce(r0, event, "node-a", [], node_a)
    result = CollectionResult(event, node_a, 2, [0, 1], [], announced=r0.wait_for_dumps(event, 1.0))
    gather_missing(r0, result, tmp_path / "a")
    assert result.gathered == {1: str(node_a / "ranks" / "node-b")} and result.refused == []
    assert (node_a / "ranks" / "node-b" / "rank_00001.gloo.fr.pkl").read_bytes() == b"\x80\x04N."


def test_unpack_ignores_paths_that_leave_the_folder(tmp_path: Path) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("../evil.txt", "ok.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    out = unpack(buffer.getvalue(), tmp_path / "x", inside=tmp_path)
    assert [p.name for p in out.written] == ["ok.txt"] and not (tmp_path / "evil.txt").exists()
    assert len(out.refused) == 1 and "../evil.txt" in out.refused[0]


def test_pack_roundtrip(tmp_path: Path) -> None:
    src = tmp_path / "f.txt"
    src.write_text("hello")
    packed = pack_files([src])
    assert packed.startswith(b"\xfd7zXZ\x00")  # xz
    assert unpack(packed, tmp_path / "out", inside=tmp_path).written[0].read_text() == "hello"


def test_a_gzipd_tar_is_still_read(tmp_path: Path) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("ok.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    assert unpack(buffer.getvalue(), tmp_path / "x", inside=tmp_path).written[0].read_text() == "hi"


@pytest.mark.parametrize("cut", [1, 100, -40])
def test_a_cut_xz_blob_keeps_what_was_whole_and_says_the_rest_was_unreadable(tmp_path: Path, cut: int) -> None:
    files = []
    for index in range(3):
        path = tmp_path / f"rank_0000{index}.stacks.txt"
        path.write_bytes(os.urandom(200_000))
        files.append(path)
    packed = pack_files(files)
    out = unpack(packed[:cut] if cut > 0 else packed[:cut], tmp_path / "out", inside=tmp_path)
    assert out.refused and out.refused[-1].startswith("archive unreadable after")
    assert all(p.read_bytes() == (tmp_path / p.name).read_bytes() for p in out.written)


def test_analyzer_failure_is_logged_and_dumps_stay(tmp_path: Path, monkeypatch, caplog) -> None:
    (r0,) = coordinators(1)
    event = r0.propose("stall")
    folder = tmp_path / event.name
    folder.mkdir()
    (folder / "rank_00000.context.json").write_text("{}")
    announce(r0, event, "h", [folder / "rank_00000.context.json"], folder)
    import builtins

    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "lightning_ncclx.analysis":
            raise ImportError("analyzer broken")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing_import)
    result = gather_and_summarize(r0, event, folder, dump_dir=tmp_path, collect_timeout_seconds=1.0,
                                  gather_through_store=True)
    if result.reports_writer is not None:
        assert result.reports_writer.join(60.0)
    assert result.verdict is None and (folder / "rank_00000.context.json").exists()
    assert json.loads((folder / "collection.json").read_text())["dumped_ranks"] == [0]
    assert "could not be imported" in caplog.text


def test_the_watchdog_and_the_initiator_load_the_analyzer_only_when_an_event_is_summarized() -> None:
    import subprocess
    import sys

    code = ("import json, sys, lightning_ncclx.watchdog.runtime, lightning_ncclx.events.gather; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('lightning_ncclx.analysis.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    loaded = set(json.loads(out))
    assert not loaded & {"lightning_ncclx.analysis.diagnose", "lightning_ncclx.analysis.load",
                         "lightning_ncclx.analysis.align", "lightning_ncclx.analysis.parse"}, loaded
    assert "lightning_ncclx.analysis.safe_pickle" in loaded  # the dump writer's one need


def test_only_processes_in_the_same_scope_are_checked_and_reported_gone() -> None:
    import subprocess
    import sys

    from lightning_ncclx.events.liveness import ProcessInfo, this_process

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = this_process(0)
    assert me is not None
    ranks = coordinators(4)
    ranks[0].register_process(me)
    ranks[1].register_process(ProcessInfo(1, me.host, dead.pid, 1, me.scope))  # same scope, exited
    ranks[2].register_process(ProcessInfo(2, me.host, dead.pid, 1, "other-boot/pid:[1]"))  # other container
    event = EventMeta(1, "stall-001", "stall", 0)
    assert ranks[0].check_local_peers(event) == {1}
    assert ranks[3].gone_ranks(event) == {1}


def test_an_initiator_alone_on_the_stores_host_is_alone_only_where_it_or_its_launcher_serves_the_store() -> None:
    """``alone`` in the meta: this rank serves the store, or its parent process does (torchrun's
    agent, which closes the store only once its ranks are gone), and no other rank is registered
    on its host. A rank on the store's machine whose store another process serves (one rank per
    container sharing the host's network) is not alone: the store's loss says nothing of it."""
    import dataclasses

    from lightning_ncclx.events.liveness import this_process

    me = this_process(0)
    assert me is not None
    for serves, alone in ((True, True), (False, False)):
        first, second, third, _ = coordinators(4)
        first.serves_store = serves
        first.store_host_address = "127.0.0.1"
        first.register_process(me)
        second.register_process(dataclasses.replace(me, rank=1, host="another-host", scope="other-boot/pid:[1]"))
        meta = first.propose("stall")
        assert meta is not None and meta.alone is alone and meta.store_host and meta.host_ranks == (), meta
        third.register_process(dataclasses.replace(me, rank=2))  # on the store's host too
        shared = first.propose("stall")
        assert shared is not None and not shared.alone and shared.host_ranks == (2,), shared


CHILD_PROPOSES = """
import sys
import torch.distributed as dist
from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.coordinator import EventCoordinator
from lightning_ncclx.events.liveness import this_process
rank = EventCoordinator(StoreClient(dist.PrefixStore("test", dist.HashStore())), 0, 4)
rank.store_host_address, rank.store_port = "127.0.0.1", int(sys.argv[1])
rank.register_process(this_process(0))
print("alone" if rank.propose("stall").alone else "not alone")
"""


def test_a_rank_whose_launcher_serves_the_store_alone_on_its_host_is_alone(tmp_path: Path) -> None:
    """A real parent process listening on the store's port (as torchrun's agent does) and a
    child rank: alone; the same child told of a port nobody here listens on: not alone."""
    import socket
    import subprocess
    import sys

    from support import clean_env, free_port

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        said = {}
        for port in (server.getsockname()[1], free_port()):
            out = subprocess.run([sys.executable, "-c", CHILD_PROPOSES, str(port)], capture_output=True, text=True,
                                 env=clean_env(), timeout=120)
            assert out.returncode == 0, out.stderr[-3000:]
            said[port] = out.stdout.strip()
    assert list(said.values()) == ["alone", "not alone"], said
