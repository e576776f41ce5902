"""Completed, legitimate send/recv pairs recorded by the nccl2 hook, between ordinary collectives:
what torch 2.15's own analyzer (torch.distributed.flight_recorder, i.e. torchfrtrace) does with
them, next to what lightning-ncclx says (no_hang).

Checked against torch 2.15.0: it does *not* report a false-positive mismatch here. With the recv
written ``recv 0->1`` (the same arrow as the send, as the hook-style dumps in the brief describe)
it crashes in ``Op.__init__`` (``ValueError``: it only parses ``recv D<-S``); with torch's own
``recv 1<-0`` form it passes every entry. Either way lightning-ncclx reads both arrow forms and says no_hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import dump, entry, write

from lightning_ncclx.analysis import Verdict, analyze_folder

builder = pytest.importorskip("torch.distributed.flight_recorder.components.builder")
config_manager = pytest.importorskip("torch.distributed.flight_recorder.components.config_manager")
loader = pytest.importorskip("torch.distributed.flight_recorder.components.loader")

PREFIX = "nccl_trace_rank_"


def _hook_dumps(folder: Path, recv_name: str) -> Path:
    """2 ranks on nccl2: 3 all_reduce, 2 completed send/recv pairs 0->1 (is_p2p, p2p_seq_id 1-2,
    collective_seq_id 0), 2 more all_reduce; everything completed."""
    for rank in range(2):
        es = [entry(i, i + 1, lib="nccl2") for i in range(3)]
        for k in range(2):
            es.append(entry(3 + k, 0, "send 0->1" if rank == 0 else recv_name, lib="nccl2", p2p_seq=k + 1,
                            is_p2p=True))
        es += [entry(5 + i, 4 + i, lib="nccl2") for i in range(2)]
        write(folder, f"{PREFIX}{rank}", dump(es, {"0": ("default_pg", [0, 1])}))
    return folder


def _torchfrtrace_db(folder: Path):
    """What ``torchfrtrace DIR -p PREFIX`` computes, through its own components."""
    args = config_manager.JobConfig().parse_args([str(folder), "-p", PREFIX])
    details, version = loader.read_dir(args)
    return builder.build_db(details, args, version)


def test_hook_style_recv_crashes_torchfrtrace_and_we_say_no_hang(tmp_path):
    folder = _hook_dumps(tmp_path, "recv 0->1")
    with pytest.raises(ValueError, match="not enough values to unpack"):
        _torchfrtrace_db(folder)  # Op.__init__: meta.split("<-") on "0->1"
    s = analyze_folder(folder)
    assert s.verdict is Verdict.NO_HANG and s.findings == () and s.ranks_seen == (0, 1)


def test_torch_style_recv_passes_torchfrtrace_and_we_agree(tmp_path):
    folder = _hook_dumps(tmp_path, "recv 1<-0")
    db = _torchfrtrace_db(folder)
    names = [c.collective_name for c in db.collectives]
    assert names.count("nccl2:send 0->1") == 2 and names.count("nccl2:all_reduce") == 5
    assert all(c.pass_check for c in db.collectives)  # no false positive in torch 2.15
    assert all(c.type_of_mismatch is None for c in db.collectives)
    s = analyze_folder(folder)
    assert s.verdict is Verdict.NO_HANG and s.findings == ()
