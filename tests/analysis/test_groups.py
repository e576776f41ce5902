"""groups: the world size (contexts, default_pg members, ranks seen; absurd sizes not believed) and
each group's global ranks by trust order: the dumps' pg_config (majority), then context.json's,
then inference (default group spans the world; any other group only the ranks that mention it)."""

from __future__ import annotations

from synth import collectives, dump, entry

from lightning_ncclx.analysis.groups import MAX_WORLD_SIZE, resolve_groups, world_size
from lightning_ncclx.analysis.model import RankContext
from lightning_ncclx.analysis.parse import build_trace


def _trace(rank: int, groups: dict, entries: list | None = None, lib: str = "nccl"):
    es = entries if entries is not None else collectives(2, lib=lib)
    return build_trace(dump(es, groups), rank, f"rank_{rank}.pkl")


def _ctx(rank: int, world: int | None = None, pg: dict | None = None) -> RankContext:
    return RankContext(rank, f"rank_{rank}.context.json", world_size=world, pg_config=pg or {})


def test_world_size_of_nothing_is_zero():
    assert world_size((), {}) == 0


def test_world_size_takes_the_largest_of_contexts_default_group_and_ranks_seen():
    traces = (_trace(0, {"0": ("default_pg", [0, 1, 2, 3])}), _trace(1, {}))
    assert world_size(traces, {}) == 4  # default_pg's highest member + 1
    assert world_size(traces, {0: _ctx(0, 16)}) == 16
    assert world_size((_trace(6, {}),), {}) == 7  # a rank seen
    assert world_size((), {9: _ctx(9)}) == 10  # a context's rank, without world_size


def test_world_size_ignores_absurd_or_empty_declarations():
    contexts = {0: _ctx(0, MAX_WORLD_SIZE + 1), 1: _ctx(1, 0), 2: _ctx(2, -5)}
    assert world_size((), contexts) == 3
    assert world_size((), {0: _ctx(0, MAX_WORLD_SIZE)}) == MAX_WORLD_SIZE
    only_sub = (_trace(0, {"1": ("tp", [0, 7])}),)  # only a default_pg row says the world's size
    assert world_size(only_sub, {}) == 1


def test_declared_membership_is_the_majority_of_the_dumps_pg_config():
    sub = [entry(i, i + 1, pg=("5", "tp")) for i in range(2)]
    traces = tuple(_trace(r, {"5": ("tp", members)}, sub) for r, members in
                   ((0, [2, 0]), (2, [0, 2]), (4, [0, 4])))
    (g,) = resolve_groups(traces, {}).values()
    assert (g.name, g.desc, g.lib, g.membership_known) == ("5", "tp", "nccl", True)
    assert g.ranks == (0, 2)  # two dumps of three say {0, 2}; sorted


def test_contexts_pg_config_is_used_when_no_dump_declares_the_group():
    sub = [entry(0, 1, pg=("5", "tp"))]
    traces = (_trace(1, {}, sub), _trace(3, {}, sub))
    contexts = {1: _ctx(1, pg={"5": ("tp", (3, 1, 2))})}
    groups = resolve_groups(traces, contexts)
    assert groups[("nccl", "5")].ranks == (1, 2, 3) and groups[("nccl", "5")].membership_known


def test_a_dumps_declaration_beats_a_contexts():
    sub = [entry(0, 1, pg=("5", "tp"))]
    traces = (_trace(1, {"5": ("tp", [1, 3])}, sub),)
    contexts = {1: _ctx(1, pg={"5": ("tp", (0, 1, 2, 3))}), 2: _ctx(2, pg={"5": ("tp", (0, 1, 2, 3))})}
    assert resolve_groups(traces, contexts)[("nccl", "5")].ranks == (1, 3)


def test_an_undeclared_default_group_spans_the_world():
    traces = (_trace(0, {}), _trace(2, {}))
    g = resolve_groups(traces, {0: _ctx(0, 5)})[("nccl", "0")]
    assert g.ranks == (0, 1, 2, 3, 4) and g.membership_known


def test_glooS_undefined_group_zero_spans_the_world_too():
    es = [entry(i, i + 1, lib="gloo", pg=("0", "undefined")) for i in range(2)]
    traces = (_trace(0, {}, es), _trace(1, {}, es))
    g = resolve_groups(traces, {0: _ctx(0, 3)})[("gloo", "0")]
    assert g.ranks == (0, 1, 2) and g.membership_known and g.desc == "undefined"


def test_an_undeclared_sub_group_is_the_ranks_that_mention_it_and_says_membership_is_unknown():
    sub = [entry(0, 1, pg=("7", "pp"))]
    traces = (_trace(1, {}, sub), _trace(3, {}, sub), _trace(2, {}))
    g = resolve_groups(traces, {0: _ctx(0, 8)})[("nccl", "7")]
    assert g.ranks == (1, 3) and not g.membership_known


def test_groups_are_keyed_by_backend_and_name():
    traces = (_trace(0, {"0": ("default_pg", [0, 1])}), _trace(0, {}, collectives(2, lib="gloo")))
    groups = resolve_groups(traces, {})
    assert sorted(groups) == [("gloo", "0"), ("nccl", "0")]
    assert groups[("nccl", "0")].ranks == (0, 1) and groups[("gloo", "0")].ranks == (0, 1)


def test_a_group_used_only_for_p2p_is_resolved_from_its_declaration():
    send = entry(2, 0, "send 0->1", pg=("3", "pp"), p2p_seq=1, is_p2p=True, state="started")
    traces = (_trace(2, {"0": ("default_pg", [0, 1, 2, 3]), "3": ("pp", [2, 3])}, collectives(2) + [send]),)
    assert resolve_groups(traces, {})[("nccl", "3")].ranks == (2, 3)
