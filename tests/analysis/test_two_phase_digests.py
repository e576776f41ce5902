"""A two-phase gather keeps the verdict: real gloo dumps where every rank but the summarizing one
is first read from its digest, then only the smaller side of the first diagnosis (its culprits,
or the ranks waiting for them where fewer) is replaced by full dumps, no peers (``events/two_phase.py``
does this through the store, with two peers more by default). The first diagnosis the gather makes
from the digests in memory is the analyzer's reading of the expanded files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze, analyze_folder
from lightning_ncclx.dump.digest import make_digest
from lightning_ncclx.dump.digest_expand import expand
from lightning_ncclx.events.first_diagnosis import FirstDiagnosis
from lightning_ncclx.events.two_phase import ranks_to_pull
from lightning_ncclx.layout import COLLECTION_FILE, rank_prefix
from lightning_ncclx.report import render_json

SCENARIOS = ["skip", "op", "size", "outside", "subgroup", "wrap", "uneven", "uneven_skip", "order", "extra", "healthy"]
SUMMARIZER = 0


def _files(folder: Path, rank: int) -> list[Path]:
    return sorted(folder.glob(f"{rank_prefix(rank)}.*"))


def _summarizers_folder(full: Path, tmp_path: Path) -> tuple[Path, list[int], list[int]]:
    """The event folder with the summarizing rank's own dump; every rank, and the others."""
    folder = tmp_path / "stall-001"
    folder.mkdir()
    for path in _files(full, SUMMARIZER):
        shutil.copy(path, folder / path.name)
    ranks = sorted({int(p.name[5:10]) for p in full.glob("rank_*.fr.pkl")})
    return folder, ranks, [r for r in ranks if r != SUMMARIZER]


def _write_digest(src: Path, dst: Path, rank: int, world_size: int, first: FirstDiagnosis) -> None:
    expanded = expand(make_digest(_files(src, rank)), rank, world_size)
    for name, data in expanded.files().items():
        (dst / name).write_bytes(data)
    first.add(expanded, "host")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_digests_then_the_culprits_full_dumps_give_the_full_verdict(gloo_dumps, scenario, tmp_path):
    full = gloo_dumps[scenario] / "ours"
    expected = analyze_folder(full)
    folder, ranks, digests = _summarizers_folder(full, tmp_path)
    in_memory = FirstDiagnosis(folder)  # before any digest is written there
    for r in digests:
        _write_digest(full, folder, r, len(ranks), in_memory)
    first = analyze_folder(folder)
    fast = in_memory.run([], {}, digests)
    assert (fast.verdict, fast.culprit_ranks, fast.waiting_ranks) == (first.verdict, first.culprit_ranks,
                                                                      first.waiting_ranks), fast.headline
    want = ranks_to_pull(first, digests, peers=0)  # only the culprits: the others stay digests
    assert bool(want) == bool(first.culprit_ranks)  # a hang pulls full dumps; the healthy job none
    for r in want:
        for path in _files(full, r):
            shutil.copy(path, folder / path.name)
    (folder / COLLECTION_FILE).write_text(json.dumps({"digest_only_ranks": [r for r in digests if r not in want]}))
    final = analyze_folder(folder)
    assert (final.verdict, final.culprit_ranks) == (expected.verdict, expected.culprit_ranks), final.headline
    if len(want) < len(digests):
        assert any("digests only of rank(s)" in note for note in final.notes), final.notes


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_summary_from_memory_is_what_summarize_reads_from_the_folder(gloo_dumps, scenario, tmp_path):
    """The gather's summary keeps the expanded digests in memory instead of reading their files
    back (``FirstDiagnosis.final_loaded``); ``lightning-ncclx summarize`` of the folder reads every
    file. Both give the same summary.json, in the gather's layout: digests under ``ranks/<host>/``,
    the pulled full dumps unpacked over them."""
    full = gloo_dumps[scenario] / "ours"
    folder, ranks, digests = _summarizers_folder(full, tmp_path)
    in_memory = FirstDiagnosis(folder)
    host_of = {r: f"node-{r % 2}" for r in digests}
    for r in digests:
        expanded = expand(make_digest(_files(full, r)), r, len(ranks))
        target = folder / "ranks" / host_of[r]
        target.mkdir(parents=True, exist_ok=True)
        for name, data in expanded.files().items():
            (target / name).write_bytes(data)
        in_memory.add(expanded, host_of[r])
    want = ranks_to_pull(in_memory.run([], {}, digests), digests, peers=1)
    for r in want:
        for path in _files(full, r):
            shutil.copy(path, folder / "ranks" / host_of[r] / path.name)
    digest_only = [r for r in digests if r not in want]
    (folder / COLLECTION_FILE).write_text(json.dumps({"digest_only_ranks": digest_only}))
    loaded = in_memory.final_loaded(digest_only, [folder / "ranks" / host_of[r] for r in want])
    assert render_json(analyze(loaded)) == render_json(analyze_folder(folder))
