import json

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from autofuse.plan import FusionLimits
from autofuse.plan import FusionPlan
from autofuse.plan import IllegalPlanError
from autofuse.plan import group_kinds
from autofuse.plan import topo_groups
from autofuse.plan import validate


def test_canonical_form_and_key():
    a = FusionPlan.from_groups([[3, 1], [0], [2]], "x")
    b = FusionPlan.from_groups([(2,), (1, 3), (0,)], "y")
    assert a == b and a.key == b.key and hash(a) == hash(b)
    assert a.groups == ((0,), (1, 3), (2,))
    assert FusionPlan.from_groups([[0, 1], [2, 3]]).key != a.key


def test_json_round_trip():
    plan = FusionPlan.from_groups([[0, 1], [2], [3, 4]], "p")
    text = json.dumps(plan.to_dict())
    back = FusionPlan.from_dict(json.loads(text))
    assert back == plan and back.name == "p"
    with pytest.raises(ValueError, match="does not match"):
        FusionPlan.from_dict({"groups": [[0], [1]], "key": plan.key})


def rule_of(graph, plan, limits=None):
    with pytest.raises(IllegalPlanError) as info:
        validate(graph, plan, limits)
    return info.value


def test_partition_rules(small):
    g = small.graph
    err = rule_of(g, FusionPlan.from_groups([[0, 1], [1, 2], [3, 4, 5, 6, 7]]))
    assert err.rule == "partition" and err.nodes == (1,)
    err = rule_of(g, FusionPlan.from_groups([[0, 1, 2, 3]]))
    assert err.rule == "partition" and err.nodes == (4, 5, 6, 7)


def test_convexity_rule(small):
    # matmul (0) and sum (2) without relu (1) between them: the path 0->1->2 leaves and re-enters
    plan = FusionPlan.from_groups([[0, 2], [1], [3], [4], [5], [6], [7]])
    err = rule_of(small.graph, plan)
    assert err.rule == "convexity" and err.nodes == (1,)
    assert "re-enters" in str(err)


def test_acyclic_rule():
    from autofuse.graph import OpGraph
    from autofuse.graph import OpKind
    from autofuse.graph import OpNode

    nodes = tuple(OpNode(i, f"n{i}", "relu", OpKind.ELEMWISE, (4,), "float32", 4, 16, 16) for i in range(4))
    g = OpGraph(nodes, ((0, 2), (1, 3)))
    # {0,3} and {1,2} are each convex, but 0->2 and 1->3 make them depend on each other
    plan = FusionPlan.from_groups([[0, 3], [1, 2]])
    err = rule_of(g, plan)
    assert err.rule == "acyclic" and err.nodes == (0, 1, 2, 3)
    validate(g, FusionPlan.from_groups([[0, 1], [2, 3]]))


def test_limits_rules(small):
    g = small.graph
    all_in_one = FusionPlan.from_groups([range(8)])
    validate(g, all_in_one)
    assert rule_of(g, all_in_one, FusionLimits(max_ops_per_group=4)).rule == "max_ops"
    two_anchor_free = FusionLimits(max_anchors_per_group=0)
    assert rule_of(g, all_in_one, two_anchor_free).rule == "max_anchors"
    no_reduction = FusionLimits(kinds=frozenset({"vertical", "horizontal"}))
    assert rule_of(g, all_in_one, no_reduction).rule == "kind:reduction"
    horizontal = FusionPlan.from_groups([[0, 4], [1], [2], [3], [5], [6], [7]])
    assert group_kinds(g, (0, 4)) == {"horizontal"}
    no_horizontal = FusionLimits(kinds=frozenset({"vertical", "reduction"}))
    assert rule_of(g, horizontal, no_horizontal).rule == "kind:horizontal"
    validate(g, horizontal)


def test_unfusable_rule(small):
    from dataclasses import replace

    from autofuse.graph import OpGraph

    nodes = list(small.graph.nodes)
    nodes[1] = replace(nodes[1], fusable=False)
    g = OpGraph(tuple(nodes), small.graph.edges, small.graph.outputs)
    assert rule_of(g, FusionPlan.from_groups([[0, 1], *[[i] for i in range(2, 8)]])).rule == "unfusable"


def test_topo_groups_respects_dependencies(small):
    plan = small.tvm_default()
    order = topo_groups(small.graph, plan)
    pos = {n: i for i, grp in enumerate(order) for n in grp}
    assert all(pos[u] <= pos[v] for u, v in small.graph.edges)


# --- property: validate agrees with a brute-force oracle on random partitions -----------------


def _paths(graph):
    reach = {u: set() for u in range(len(graph))}
    for u in reversed(range(len(graph))):
        for v in graph.succs[u]:
            reach[u] |= {v} | reach[v]
    return reach


def oracle_violations(graph, plan, limits):
    reach = _paths(graph)
    bad = set()
    for grp in plan.groups:
        members = set(grp)
        if len(grp) > 1:
            if any(not graph.nodes[n].fusable for n in grp):
                bad.add("unfusable")
            if len(grp) > limits.max_ops_per_group:
                bad.add("max_ops")
            if sum(graph.nodes[n].is_anchor for n in grp) > limits.max_anchors_per_group:
                bad.add("max_anchors")
            for k in group_kinds(graph, grp) - limits.kinds:
                bad.add(f"kind:{k}")
        for w in range(len(graph)):
            if w in members:
                continue
            if any(w in reach[a] for a in members) and any(b in reach[w] for b in members):
                bad.add("convexity")
    group_of = plan.group_of()
    greach = {}
    for i in range(len(plan.groups)):
        greach[i] = {group_of[v] for a in plan.groups[i] for v in reach[a]} - {i}
    changed = True
    while changed:  # transitive closure on groups
        changed = False
        for i in greach:
            new = set().union(*(greach[j] for j in greach[i])) | greach[i]
            if new != greach[i]:
                greach[i], changed = new, True
    if any(i in greach[i] for i in greach) or any(i in greach.get(j, ()) and j in greach[i] for i in greach for j in greach[i]):
        bad.add("acyclic")
    return bad


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_validate_matches_oracle(transformer, data):
    g = transformer.graph
    k = data.draw(st.integers(min_value=len(g) // 3, max_value=len(g)))
    labels = data.draw(st.lists(st.integers(0, k - 1), min_size=len(g), max_size=len(g)))
    groups = {}
    for n, lab in enumerate(labels):
        groups.setdefault(lab, []).append(n)
    plan = FusionPlan.from_groups(groups.values())
    limits = FusionLimits(max_ops_per_group=data.draw(st.integers(2, 12)), max_anchors_per_group=2)
    expected = oracle_violations(g, plan, limits)
    if not expected:
        validate(g, plan, limits)
        return
    with pytest.raises(IllegalPlanError) as info:
        validate(g, plan, limits)
    assert info.value.rule in expected
