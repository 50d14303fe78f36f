from collections import Counter

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from autofuse.plan import FusionLimits
from autofuse.plan import FusionPlan
from autofuse.plan import IllegalPlanError
from autofuse.plan import validate
from autofuse.space import SearchSpace
from autofuse.space import load_limits


def test_decisions_of_small(small):
    space = SearchSpace(small.graph)
    kinds = {d.id: d.kind for d in space.decisions}
    assert kinds["r:2-3"] == "reduction"  # sum -> divide
    assert kinds["v:0-1"] == "vertical"  # matmul -> relu epilogue
    assert kinds["h:4-6"] == "horizontal"  # exp(x) and x*x read the same input
    assert len(space.by_id) == len(space.decisions)


def test_all_kinds_present_on_transformer(transformer):
    counts = Counter(d.kind for d in SearchSpace(transformer.graph).decisions)
    assert counts["vertical"] > 0 and counts["horizontal"] > 0 and counts["reduction"] > 0


def test_kinds_can_be_disabled(transformer):
    _, limits = load_limits("vertical_only")
    space = SearchSpace(transformer.graph, limits)
    assert {d.kind for d in space.decisions} == {"vertical"}


def test_tvm_default_round_trips(small, conv_block, transformer, mlp):
    for w in (small, conv_block, transformer, mlp):
        space = SearchSpace(w.graph)
        plan = w.tvm_default()
        assert space.decode(space.encode(plan)) == plan
        unfused = w.unfused()
        assert space.decode(space.encode(unfused)) == unfused


def test_plans_tvm_never_makes(small, transformer):
    space = SearchSpace(small.graph)
    red = space.decode({"r:2-3": True, "v:1-2": True, "v:1-3": True})
    assert (1, 2, 3) in red.groups  # a reduction fused into its consumer
    space = SearchSpace(transformer.graph)
    two_anchors = space.plan_of_kinds({"vertical", "reduction"})
    g = transformer.graph
    assert any(sum(g.nodes[n].is_anchor for n in grp) == 2 for grp in two_anchors.groups)


def test_decode_respects_limits(transformer):
    limits = FusionLimits(max_ops_per_group=3, max_anchors_per_group=1)
    space = SearchSpace(transformer.graph, limits)
    plan = space.decode({d.id: True for d in space.decisions})
    validate(transformer.graph, plan, limits)
    assert max(len(g) for g in plan.groups) <= 3


def test_space_files_load():
    for name in ("default", "vertical_only", "gpu"):
        label, limits = load_limits(name)
        assert label == name and limits.kinds
    # where no space file is read (autofuse bench, the measurer's default) the limits are the
    # default space's: with 32 ops a group, TVM's own plan of Mamba (a 41-op group) was illegal
    assert load_limits("default")[1] == FusionLimits()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_parameter_vector_decodes_to_a_legal_plan(transformer, data):
    space = SearchSpace(transformer.graph)
    params = {d.id: data.draw(st.booleans()) for d in space.decisions}
    plan = space.decode(params)
    validate(transformer.graph, plan, space.limits)
    # decoding is a pure function of the parameters
    assert space.decode(params) == plan
    # a decision not taken never joins two groups on its own: re-encoding only adds decisions
    # implied by the groups, so decoding the encoding gives the same plan
    assert space.decode(space.encode(plan)) == plan


def test_plus_kinds_seeds_on_transformer(transformer):
    # the engineer's first tries beside TVM's plan: each a union of TVM's groups, legal, and
    # +epilogues only moves elementwise/injective groups into an anchored group
    space = SearchSpace(transformer.graph)
    base = transformer.tvm_default()
    plans = {p.name: p for p in space.plus_kinds(base)}
    assert {"tvm_default+epilogues", "all_fused"} <= set(plans)
    base_of = base.group_of()
    nodes = transformer.graph.nodes
    for plan in plans.values():
        validate(transformer.graph, plan, space.limits)
        for group in plan.groups:
            assert set(group) == {m for n in group for m in base.groups[base_of[n]]}
    grown = [g for g in plans["tvm_default+epilogues"].groups if g not in base.groups]
    assert grown
    for group in grown:
        parts = {base_of[n] for n in group}
        anchored = [b for b in parts if any(nodes[n].is_anchor for n in base.groups[b])]
        assert len(anchored) == 1
        rest = [n for b in parts - set(anchored) for n in base.groups[b]]
        assert rest and not any(nodes[n].is_anchor or nodes[n].is_reduction for n in rest)


def test_compose_takes_only_the_merges_that_paid(transformer):
    # each merge of TVM's groups that a seed measured is taken when its kernel beat the
    # kernels it replaces (with the per-kernel overhead credited), and only then
    space = SearchSpace(transformer.graph)
    base = transformer.tvm_default()
    seed = next(p for p in space.plus_kinds(base) if p.name == "tvm_default+anchors+epilogues")
    grown = [g for g in seed.groups if g not in base.groups]
    assert len(grown) >= 2
    base_of = base.group_of()
    group_s = dict.fromkeys(base.groups, 10e-6)
    faster, slower = grown[::2], grown[1::2]
    for g in grown:
        parts = len({base_of[n] for n in g})
        group_s[g] = parts * 10e-6 + (-1e-6 if g in faster else 1e-6)
    plan = space.compose(base, group_s)
    assert set(faster) <= set(plan.groups) and not set(slower) & set(plan.groups)
    assert len(plan.groups) == len(base.groups) - sum(len({base_of[n] for n in g}) - 1 for g in faster)
    validate(transformer.graph, plan, space.limits)
    assert set(grown) <= set(space.compose(base, group_s, overhead_s=2e-6).groups)
    assert space.compose(base, dict.fromkeys(base.groups, 1e-6)) == base  # nothing measured beyond


def test_compose_skips_a_merge_that_would_close_a_cycle(transformer):
    space = SearchSpace(transformer.graph)
    base = transformer.tvm_default()
    graph, groups = transformer.graph, base.groups

    def illegal(a, b):
        plan = FusionPlan.from_groups([g for g in groups if g not in (a, b)] + [a + b])
        try:
            validate(graph, plan, space.limits)
        except IllegalPlanError:
            return True
        return False

    # two groups with a path between them through a third: merged, the plan has a cycle
    a, b = next((a, b) for a in groups for b in groups if a < b and any(
        v in b for u in a for w in graph.succs[u] if w not in a + b for v in graph.succs[w]) and illegal(a, b))
    cheap = tuple(sorted(a + b))
    group_s = {**dict.fromkeys(groups, 10e-6), cheap: 1e-6}
    plan = space.compose(base, group_s)
    assert cheap not in plan.groups and plan == base
    # refused on the spot, it does not block a legal merge of one of its groups that gains less
    # (taken and only undone by the final decode, it would have)
    c = next(c for c in groups if c not in (a, b) and not illegal(a, c))
    legal = tuple(sorted(a + c))
    plan = space.compose(base, {**group_s, legal: 15e-6})
    assert legal in plan.groups and cheap not in plan.groups
    validate(graph, plan, space.limits)


def test_compose_splits_a_group_slower_than_its_ops_apart(transformer):
    space = SearchSpace(transformer.graph)
    base = transformer.tvm_default()
    big = [g for g in base.groups if len(g) > 1]
    slow, fine = big[0], big[1]
    group_s = dict.fromkeys(base.groups, 10e-6)
    group_s.update({(n,): 1e-6 for g in (slow, fine) for n in g})
    group_s[slow] = len(slow) * 1e-6 + 0.5e-6  # slower fused than its ops apart
    group_s[fine] = len(fine) * 1e-6 - 0.5e-6
    plan = space.compose(base, group_s)
    assert not {(n,) for n in fine} & set(plan.groups) and fine in plan.groups
    assert slow not in plan.groups and {(n,) for n in slow} <= set(plan.groups)
    validate(transformer.graph, plan, space.limits)
    assert slow in space.compose(base, group_s, overhead_s=1e-6).groups  # the overhead outweighs it


def _single_merges(space, base):
    """Every union of two of `base`'s groups joined by a decision that is legal on its own."""
    group_of, out = base.group_of(), set()
    for d in space.decisions:
        a, b = base.groups[group_of[d.a]], base.groups[group_of[d.b]]
        if a != b:
            union = tuple(sorted(a + b))
            try:
                validate(space.graph, FusionPlan.from_groups([g for g in base.groups if g not in (a, b)] + [union]),
                         space.limits)
            except IllegalPlanError:
                continue
            out.add(union)
    return out


def test_probe_times_many_untimed_merges_of_the_leader_in_one_legal_plan(transformer):
    space = SearchSpace(transformer.graph)
    base = transformer.tvm_default()
    base_of = base.group_of()
    singles = _single_merges(space, base)
    timed, probed, probes = set(base.groups), [], 0
    while (plan := space.probe(base, timed)) is not None:
        validate(transformer.graph, plan, space.limits)
        grown = [g for g in plan.groups if g not in base.groups]
        parts = [{base_of[n] for n in g} for g in grown]
        # each new kernel is two of the leader's groups, each group in one merge at most
        assert grown and all(len(p) == 2 for p in parts) and len(set().union(*parts)) == 2 * len(parts)
        assert not set(grown) & timed  # nothing timed is probed again
        probed += grown
        timed |= set(grown)
        probes += 1
    # probe after probe, every legal merge is timed, many in each
    assert set(probed) == singles and len(singles) >= 2 * probes
    # a merge whose parts are not both timed is no candidate
    untimed = base.groups[base_of[next(iter(next(iter(singles))))]]
    assert not any(set(untimed) < set(g) for g in space.probe(base, set(base.groups) - {untimed}).groups
                   if g not in base.groups)


def test_probe_takes_the_merges_with_the_largest_predicted_saving_first(transformer):
    space = SearchSpace(transformer.graph)
    base = transformer.tvm_default()
    singles = _single_merges(space, base)
    # a group with two candidate partners: only one merge of it fits in a probe
    shared = next(g for g in base.groups if sum(set(g) < set(u) for u in singles) >= 2)
    first, second = [u for u in sorted(singles) if set(shared) < set(u)][:2]
    for favoured, other in ((first, second), (second, first)):
        plan = space.probe(base, set(base.groups), lambda merges: [1.0 if u == favoured else 0.0 for _, _, u in merges])
        assert favoured in plan.groups and other not in plan.groups


def test_search_parameters_tie_the_decisions_of_repeated_blocks():
    import random

    from test_graph import chain_of_blocks

    graph = chain_of_blocks(8)
    space = SearchSpace(graph)
    members = [ids for ids in space.tied.values() if len(ids) > 1]
    assert len(space.tied) < len(space.decisions) and members
    for ids in members:  # one decision per block, all of the same kind
        ds = [space.by_id[i] for i in ids]
        assert len({d.a // 3 for d in ds}) == len(ds) and len({d.kind for d in ds}) == 1
    assert sorted(i for ids in space.tied.values() for i in ids) == sorted(d.id for d in space.decisions)
    # random plans treat repeated blocks alike
    rng = random.Random(0)
    for _ in range(5):
        params = space.random_params(rng.random)
        assert all(len({params[i] for i in ids}) == 1 for ids in space.tied.values())
    # a plan that treats them alike round-trips through the tied parameters; one that does
    # not gets the value most of its blocks have
    every_epilogue = space.decode({d.id: graph.nodes[d.a].op == "matmul" for d in space.decisions})
    assert space.decode(space.untie(space.tie(space.encode(every_epilogue)))) == every_epilogue
    ids = members[0]
    odd = space.decode({ids[0]: True})
    assert len(odd.groups) == len(graph.nodes) - 1  # one merge, in one block
    assert not any(space.tie(space.encode(odd)).values())


def test_a_graph_without_repeats_searches_every_decision(small):
    space = SearchSpace(small.graph)
    assert all(len(ids) == 1 for ids in space.tied.values()) and len(space.tied) == len(space.decisions)
