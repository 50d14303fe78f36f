"""Fusion plans: a partition of an OpGraph's nodes into groups, one kernel per group.

A plan is a value: canonical form (sorted groups of sorted ids), a stable hash, JSON round
trip. Legality is checked here, on the pure graph, before TVM ever sees the plan, and an
illegal plan is rejected with the rule it breaks and the nodes involved.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from autofuse.graph import OpGraph

FUSION_KINDS = ("vertical", "horizontal", "reduction")


class IllegalPlanError(ValueError):
    """A plan breaks a legality rule; `rule` names it and `nodes` are the node ids involved."""

    def __init__(self, rule: str, nodes: Iterable[int], detail: str) -> None:
        self.rule = rule
        self.nodes = tuple(sorted(nodes))
        super().__init__(f"illegal plan ({rule}): {detail} [nodes {list(self.nodes)}]")


@dataclass(frozen=True)
class FusionLimits:
    """Resource and kind limits on groups; declared in search_spaces/*.json."""

    # FuseOps' own limit, as search_spaces/default.json: with less, TVM's plan of a long chain
    # (Mamba's unrolled scan: a 41-op group) was illegal wherever no space file was read
    # (`autofuse bench`, the benchmark scripts), and neither it nor a plan from it was measured
    max_ops_per_group: int = 256
    max_anchors_per_group: int = 3
    kinds: frozenset[str] = frozenset(FUSION_KINDS)
    horizontal_window: int = 8  # how far apart (in binding order) horizontal candidates may be

    @staticmethod
    def from_dict(data: dict[str, Any]) -> FusionLimits:
        kinds = data.get("kinds", list(FUSION_KINDS))
        unknown = set(kinds) - set(FUSION_KINDS)
        if unknown:
            raise ValueError(f"unknown fusion kinds {sorted(unknown)}; known: {FUSION_KINDS}")
        return FusionLimits(
            max_ops_per_group=int(data.get("max_ops_per_group", FusionLimits.max_ops_per_group)),
            max_anchors_per_group=int(data.get("max_anchors_per_group", 3)),
            kinds=frozenset(kinds),
            horizontal_window=int(data.get("horizontal_window", 8)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_ops_per_group": self.max_ops_per_group,
            "max_anchors_per_group": self.max_anchors_per_group,
            "kinds": sorted(self.kinds),
            "horizontal_window": self.horizontal_window,
        }


# structural legality only (partition, unfusable kernels, convexity, acyclic): for plans the search
# did not make under a search space's limits, such as TVM's own (int8 ResNet-50's FuseOps groups
# reach 38 ops after quantize/dequantize became elementwise ops)
NO_LIMITS = FusionLimits(max_ops_per_group=10**6, max_anchors_per_group=10**6)


@dataclass(frozen=True)
class FusionPlan:
    """Groups of node ids. Construct with `from_groups` to get the canonical form.

    `name` is a label ("unfused", "tvm_default", ...) and takes no part in equality.
    """

    groups: tuple[tuple[int, ...], ...]
    name: str = field(default="", compare=False)

    @staticmethod
    def from_groups(groups: Iterable[Iterable[int]], name: str = "") -> FusionPlan:
        canon = sorted(tuple(sorted(set(g))) for g in groups)
        return FusionPlan(tuple(g for g in canon if g), name)

    @staticmethod
    def unfused(graph: OpGraph) -> FusionPlan:
        return FusionPlan.from_groups(([n.id] for n in graph.nodes), "unfused")

    @property
    def key(self) -> str:
        """Stable 16-hex-digit hash of the canonical groups."""
        text = json.dumps(self.groups, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def num_kernels(self) -> int:
        return len(self.groups)

    def group_of(self) -> dict[int, int]:
        return {n: i for i, g in enumerate(self.groups) for n in g}

    def fused_groups(self) -> tuple[tuple[int, ...], ...]:
        return tuple(g for g in self.groups if len(g) > 1)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "groups": [list(g) for g in self.groups]}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> FusionPlan:
        plan = FusionPlan.from_groups(data["groups"], data.get("name", ""))
        if "key" in data and data["key"] != plan.key:
            raise ValueError(f"plan key {data['key']} does not match its groups ({plan.key})")
        return plan


def _bits(ids: Iterable[int]) -> int:
    out = 0
    for i in ids:
        out |= 1 << i
    return out


def _ids(bits: int) -> list[int]:
    out, i = [], 0
    while bits:
        if bits & 1:
            out.append(i)
        bits >>= 1
        i += 1
    return out


def group_kinds(graph: OpGraph, group: Iterable[int]) -> set[str]:
    """Which fusion kinds a group uses: vertical, reduction (a reduce feeding a member),
    horizontal (members not connected through the group's own edges)."""
    members = set(group)
    kinds: set[str] = set()
    parent = {m: m for m in members}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u in members:
        for v in graph.succs[u]:
            if v in members:
                kinds.add("reduction" if graph.nodes[u].is_reduction else "vertical")
                parent[find(u)] = find(v)
    if len({find(m) for m in members}) > 1:
        kinds.add("horizontal")
    return kinds


def check_group(graph: OpGraph, group: tuple[int, ...], limits: FusionLimits) -> None:
    """Raise IllegalPlanError if one group breaks a per-group rule (convexity included)."""
    if len(group) == 1:
        return
    unfusable = [n for n in group if not graph.nodes[n].fusable]
    if unfusable:
        raise IllegalPlanError("unfusable", group, "opaque or tuple-output kernels stand alone")
    if len(group) > limits.max_ops_per_group:
        raise IllegalPlanError(
            "max_ops", group, f"{len(group)} ops > max_ops_per_group={limits.max_ops_per_group}"
        )
    anchors = [n for n in group if graph.nodes[n].is_anchor]
    if len(anchors) > limits.max_anchors_per_group:
        raise IllegalPlanError(
            "max_anchors",
            anchors,
            f"{len(anchors)} anchors > max_anchors_per_group={limits.max_anchors_per_group}",
        )
    disabled = group_kinds(graph, group) - limits.kinds
    if disabled:
        raise IllegalPlanError(f"kind:{sorted(disabled)[0]}", group, "fusion kind disabled")
    bits = _bits(group)
    desc = anc = 0
    for n in group:
        desc |= graph.descendants[n]
        anc |= graph.ancestors[n]
    outside = desc & anc & ~bits
    if outside:
        raise IllegalPlanError(
            "convexity", _ids(outside), f"a path leaves group {list(group)} and re-enters it"
        )


def validate(graph: OpGraph, plan: FusionPlan, limits: FusionLimits | None = None) -> None:
    """Raise IllegalPlanError unless `plan` is a legal partition of `graph` under `limits`.

    Rules, in order: partition (every node exactly once), per-group rules (unfusable,
    max_ops, max_anchors, kind:*, convexity), acyclic (the graph of groups has no cycle).
    """
    limits = limits or FusionLimits()
    seen: dict[int, int] = {}
    for gi, group in enumerate(plan.groups):
        for n in group:
            if n in seen:
                raise IllegalPlanError("partition", [n], f"node in groups {seen[n]} and {gi}")
            if not 0 <= n < len(graph):
                raise IllegalPlanError("partition", [n], "no such node")
            seen[n] = gi
    missing = set(range(len(graph))) - set(seen)
    if missing:
        raise IllegalPlanError("partition", missing, "nodes in no group")
    for group in plan.groups:
        check_group(graph, group, limits)
    order = _group_order(graph, plan.groups, seen)
    if len(order) != len(plan.groups):
        stuck = set(range(len(plan.groups))) - set(order)
        cycle = [n for g in sorted(stuck) for n in plan.groups[g]]
        raise IllegalPlanError("acyclic", cycle, "the groups depend on each other in a cycle")


def _group_order(
    graph: OpGraph, groups: tuple[tuple[int, ...], ...], group_of: dict[int, int]
) -> list[int]:
    """Kahn's algorithm on the graph of groups; groups on a cycle are left out.

    A heap on each group's smallest member keeps the order close to the binding order.
    """
    succ: list[set[int]] = [set() for _ in groups]
    indeg = [0] * len(groups)
    for u, v in graph.edges:
        a, b = group_of[u], group_of[v]
        if a != b and b not in succ[a]:
            succ[a].add(b)
            indeg[b] += 1
    ready = [(groups[g][0], g) for g in range(len(groups)) if indeg[g] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(g)
        for h in succ[g]:
            indeg[h] -= 1
            if indeg[h] == 0:
                heapq.heappush(ready, (groups[h][0], h))
    return order


def topo_groups(graph: OpGraph, plan: FusionPlan) -> list[tuple[int, ...]]:
    """The plan's groups in an order where every group comes after those it reads from."""
    order = _group_order(graph, plan.groups, plan.group_of())
    if len(order) != len(plan.groups):
        raise IllegalPlanError("acyclic", [], "the groups depend on each other in a cycle")
    return [plan.groups[g] for g in order]
