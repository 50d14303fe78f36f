"""The plan space: fusion decisions over an OpGraph, and their decoding into legal plans.

A decision says "put these two nodes in one kernel". Three kinds, as in the mission:
vertical (producer -> consumer, anchors with their epilogues included), reduction (a reduce
feeding its elementwise/broadcast consumers: TVM's rules never do this) and horizontal (siblings
reading one tensor, or independent look-alike ops). Each decision has a stable id, so a plan is
a fixed flat set of booleans. Optuna searches one boolean per class of decisions that play the
same part in repeated blocks (`tied`: a transformer's twelve layers, one set of parameters):
fewer dimensions for the sampler to learn, and sampled plans that treat alike what is alike;
plans that do not (TVM's, the composed ones) are measured as they are.

Decoding applies the chosen decisions greedily in a fixed order, skipping any merge that would
break a legality rule, until nothing changes: every parameter vector maps to a legal plan, and
`decode(encode(p)) == p` for any legal plan whose groups are connected by decisions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from autofuse.gpu_resources import ResourceLimits
from autofuse.graph import OpGraph
from autofuse.plan import FusionLimits
from autofuse.plan import FusionPlan
from autofuse.plan import IllegalPlanError
from autofuse.plan import check_group
from autofuse.plan import validate

SPACE_DIR = Path(__file__).resolve().parent.parent / "search_spaces"


@dataclass(frozen=True, order=True)
class Decision:
    a: int
    b: int
    kind: str  # vertical | reduction | horizontal

    @property
    def id(self) -> str:
        return f"{self.kind[0]}:{self.a}-{self.b}"


def load_limits(path_or_name: str | Path | None = None) -> tuple[str, FusionLimits]:
    """Read a search-space file (a path, or a name under search_spaces/); returns (name, limits)."""
    path, data = _read_space(path_or_name)
    return str(data.get("name", path.stem)), FusionLimits.from_dict(data)


def load_resource_limits(path_or_name: str | Path | None = None) -> ResourceLimits:
    """The GPU resource limits of a search-space file (its "gpu_resources" entry; defaults:
    255 registers, no spills, the architecture's shared memory per block)."""
    return ResourceLimits.from_dict(_read_space(path_or_name)[1].get("gpu_resources"))


def _read_space(path_or_name: str | Path | None) -> tuple[Path, dict]:
    path = Path(path_or_name or "default")
    if not path.suffix:
        path = SPACE_DIR / f"{path}.json"
    if not path.is_file():
        raise FileNotFoundError(f"search-space file not found: {path}")
    return path, json.loads(path.read_text())


class SearchSpace:
    """All fusion decisions of one graph under one set of limits."""

    def __init__(self, graph: OpGraph, limits: FusionLimits | None = None) -> None:
        self.graph = graph
        self.limits = limits or FusionLimits()
        self.decisions = tuple(sorted(self._enumerate()))
        self.by_id = {d.id: d for d in self.decisions}
        classes: dict[tuple[str, int, int], list[str]] = {}
        roles = graph.roles
        for d in self.decisions:
            classes.setdefault((d.kind, roles[d.a], roles[d.b]), []).append(d.id)
        # what the search samples: one parameter per class of decisions that play the same part
        # in repeated blocks, named after its first decision (every class of one in a graph
        # without repeats: the decisions themselves)
        self.tied = {ids[0]: tuple(ids) for ids in classes.values()}

    def _enumerate(self) -> set[Decision]:
        g, lim = self.graph, self.limits
        out: set[Decision] = set()
        fusable = [n.fusable for n in g.nodes]
        for u, v in g.edges:
            if fusable[u] and fusable[v]:
                kind = "reduction" if g.nodes[u].is_reduction else "vertical"
                if kind in lim.kinds:
                    out.add(Decision(u, v, kind))
        if "horizontal" not in lim.kinds:
            return out
        for readers in self._sibling_sets():
            cands = [n for n in readers if fusable[n]]
            for a, b in zip(cands, cands[1:]):
                if b - a <= lim.horizontal_window and g.independent(a, b):
                    out.add(Decision(a, b, "horizontal"))
        for a in range(len(g)):  # independent look-alikes, e.g. parallel branches
            for b in range(a + 1, min(len(g), a + lim.horizontal_window + 1)):
                na, nb = g.nodes[a], g.nodes[b]
                if (
                    fusable[a] and fusable[b] and na.op == nb.op and na.shape == nb.shape
                    and g.independent(a, b)
                ):
                    out.add(Decision(a, b, "horizontal"))
        return out

    def _sibling_sets(self) -> list[tuple[int, ...]]:
        sets = [s for s in self.graph.succs if len(s) > 1]
        sets.extend(r for r in self.graph.input_readers if len(r) > 1)
        return sets

    def __len__(self) -> int:
        return len(self.decisions)

    def decode(self, params: dict[str, bool], name: str = "") -> FusionPlan:
        """Greedy legal merging of the chosen decisions (missing ids count as False)."""
        builder = _PlanBuilder(self.graph, self.limits)
        pending = [d for d in self.decisions if params.get(d.id, False)]
        while pending:
            left = [d for d in pending if not builder.try_merge(d.a, d.b)]
            if len(left) == len(pending):
                break
            pending = left
        return builder.plan(name)

    def encode(self, plan: FusionPlan) -> dict[str, bool]:
        group_of = plan.group_of()
        return {d.id: group_of[d.a] == group_of[d.b] for d in self.decisions}

    def untie(self, params: dict[str, bool]) -> dict[str, bool]:
        """Decision values from the search's parameters (`tied`): each class's value for all of
        its decisions."""
        return {d: v for t, v in params.items() for d in self.tied.get(t, (t,))}

    def tie(self, params: dict[str, bool]) -> dict[str, bool]:
        """The search's parameters nearest to decision values: each class takes the value most
        of its decisions have (True on a tie). Exact where a plan treats repeated blocks alike."""
        return {t: 2 * sum(params.get(d, False) for d in ds) >= len(ds) for t, ds in self.tied.items()}

    def random_params(self, draw: Callable[[], float], density: float = 0.5) -> dict[str, bool]:
        """Random decision values, each class of tied decisions taken with probability
        `density`: a random plan treats repeated blocks alike, as a sampled one does (with
        thousands of independent coin flips, a large model's random plans are noise)."""
        return self.untie({t: draw() < density for t in self.tied})

    def plan_of_kinds(self, kinds: set[str], name: str = "") -> FusionPlan:
        """The plan that takes every decision of the given kinds."""
        return self.decode({d.id: d.kind in kinds for d in self.decisions}, name)

    def plus_kinds(self, base: FusionPlan) -> list[FusionPlan]:
        """`base` with every horizontal, every reduction -> broadcast, every producer-consumer
        merge of two of its groups that both hold an anchor (attention's matmul -> softmax ->
        matmul, which rule-based fusion never builds), every merge of an anchored group into a
        consumer group of elementwise/injective ops (TVM's FuseOps stops a matmul's epilogue at
        the first reshape: BERT's GELU after its FFN matmul), those two together, and every
        decision taken: the first plans an engineer would try beside a rule-based plan (those
        equal to `base` are left out)."""
        params = self.encode(base)
        group_of = base.group_of()
        nodes = self.graph.nodes
        anchored = {i for i, g in enumerate(base.groups) if any(nodes[n].is_anchor for n in g)}
        plain = {i for i, g in enumerate(base.groups) if not any(nodes[n].is_anchor or nodes[n].is_reduction for n in g)}
        vertical = [d for d in self.decisions if d.kind != "horizontal"]
        anchors = {d.id for d in vertical if {group_of[d.a], group_of[d.b]} <= anchored}
        epilogues = {d.id for d in vertical if group_of[d.a] in anchored and group_of[d.b] in plain}
        chosen = {
            f"{base.name}+horizontal": {d.id for d in self.decisions if d.kind == "horizontal"},
            f"{base.name}+reduction": {d.id for d in self.decisions if d.kind == "reduction"},
            f"{base.name}+anchors": anchors,
            f"{base.name}+epilogues": epilogues,
            f"{base.name}+anchors+epilogues": anchors | epilogues,
            "all_fused": {d.id for d in self.decisions},
        }
        plans = {}
        for name, ids in chosen.items():
            plan = self.decode({**params, **dict.fromkeys(ids, True)}, name)
            if plan.key != base.key:
                plans.setdefault(plan.key, plan)
        return list(plans.values())

    def compose(self, base: FusionPlan, group_s: dict[tuple[int, ...], float], overhead_s: float = 0.0,
                name: str = "composed") -> FusionPlan:
        """`base` with the measured merges that paid, one kernel at a time.

        A seed such as `+anchors` takes every merge of its kind at once, and one slower fused
        kernel can sink the plan while others in it won. `group_s` holds each measured group's
        kernel time (timed alone; a kernel's time depends on its group only, not on the plan it
        came from). Greedily, the merge with the largest gain is taken: a measured group that is
        exactly a union of current groups, all measured, faster than their sum plus
        `overhead_s` per kernel saved. A merge that makes the plan illegal with those taken
        before is skipped. First, a group of `base` slower than its ops as kernels of their own
        (all measured, plus the overhead) is split into them: FuseOps makes a few such groups
        (MobileNetV2: 22.8 us fused, 14.0 us apart); splitting a convex group never closes a
        cycle. The result is a candidate to measure, not a decision; it is the plan its
        decisions decode to, so that the study measures this very plan."""
        groups = set(base.groups)
        for g in base.groups:
            ops = [(n,) for n in g]
            if (len(g) > 1 and g in group_s and all(o in group_s for o in ops)
                    and sum(group_s[o] for o in ops) + overhead_s * (len(g) - 1) < group_s[g]):
                groups = (groups - {g}) | set(ops)
        owner = {n: g for g in groups for n in g}
        refused: set[tuple[int, ...]] = set()
        while True:
            moves = []
            for group, t in group_s.items():
                parts = {owner[n] for n in group}
                if (len(parts) > 1 and group not in refused and sum(map(len, parts)) == len(group)
                        and all(p in group_s for p in parts)):
                    gain = sum(group_s[p] for p in parts) + overhead_s * (len(parts) - 1) - t
                    if gain > 0:
                        moves.append((gain, group, parts))
            if not moves:
                return self.decode(self.encode(FusionPlan.from_groups(groups)), name)
            _, group, parts = max(moves)
            try:
                validate(self.graph, FusionPlan.from_groups((groups - parts) | {group}), self.limits)
            except IllegalPlanError:  # with the merges taken before (a cycle through another group)
                refused.add(group)
                continue
            groups = (groups - parts) | {group}
            owner.update(dict.fromkeys(group, group))

    def probe(self, base: FusionPlan, timed: Collection[tuple[int, ...]],
              gain: Callable[[list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]], list[float]] | None = None,
              name: str = "probe") -> FusionPlan | None:
        """`base` with as many untimed merges of two of its groups as fit in one legal plan.

        A kernel's time depends on its group only, and measuring a plan times each of its
        kernels, so one plan can time many candidate merges at once; `compose` then takes those
        that paid. Candidates are pairs of `base`'s groups joined by a decision, both parts in
        `timed`, the union not; they are taken greedily in the order of `gain` (called with
        (part, part, union) triples; the cost model's predicted saving), else in decision
        order, each group in at most one merge, skipping any that breaks a legality rule. None
        when no candidate is left."""
        group_of = base.group_of()
        pairs: dict[tuple[int, ...], tuple[int, int]] = {}
        for d in self.decisions:
            ga, gb = group_of[d.a], group_of[d.b]
            if ga == gb:
                continue
            a, b = base.groups[ga], base.groups[gb]
            union = tuple(sorted(a + b))
            if union in timed or union in pairs or a not in timed or b not in timed:
                continue
            try:
                check_group(self.graph, union, self.limits)
            except IllegalPlanError:
                continue
            pairs[union] = (ga, gb)
        if not pairs:
            return None
        order = list(pairs)
        if gain is not None:
            gains = gain([(base.groups[pairs[u][0]], base.groups[pairs[u][1]], u) for u in order])
            order = [u for _, u in sorted(zip(gains, order), key=lambda gu: -gu[0])]
        used: set[int] = set()
        groups = set(base.groups)
        for union in order:
            ga, gb = pairs[union]
            if ga in used or gb in used:
                continue
            merged = (groups - {base.groups[ga], base.groups[gb]}) | {union}
            try:
                validate(self.graph, FusionPlan.from_groups(merged), self.limits)
            except IllegalPlanError:  # a cycle through another group, with the merges taken before
                continue
            groups = merged
            used |= {ga, gb}
        if not used:
            return None
        return self.decode(self.encode(FusionPlan.from_groups(groups)), name)


class _PlanBuilder:
    def __init__(self, graph: OpGraph, limits: FusionLimits) -> None:
        self.graph, self.limits = graph, limits
        self.leader = list(range(len(graph)))
        self.members: dict[int, list[int]] = {i: [i] for i in range(len(graph))}

    def find(self, x: int) -> int:
        while self.leader[x] != x:
            self.leader[x] = self.leader[self.leader[x]]
            x = self.leader[x]
        return x

    def try_merge(self, a: int, b: int) -> bool:
        ga, gb = self.find(a), self.find(b)
        if ga == gb:
            return True
        merged = tuple(sorted(self.members[ga] + self.members[gb]))
        try:
            check_group(self.graph, merged, self.limits)
        except IllegalPlanError:
            return False
        if self._closes_cycle(ga, gb):
            return False
        self.leader[gb] = ga
        self.members[ga] = list(merged)
        del self.members[gb]
        return True

    def _closes_cycle(self, ga: int, gb: int) -> bool:
        # After merging, a cycle exists iff some path leaves the merged group through another
        # group and comes back; search the group graph from the merged group's successors.
        # Node ids are topologically ordered, so a group whose first node comes after the merged
        # group's last leads only further on: the search stays between the two (RWKV, 1,814
        # nodes, a random half of its 4,190 decisions taken: decoding 0.50 s -> 0.20 s).
        start = {ga, gb}
        last = max(self.members[ga][-1], self.members[gb][-1])
        frontier = list({
            h
            for g in start
            for u in self.members[g]
            for v in self.graph.succs[u]
            if (h := self.find(v)) not in start and self.members[h][0] < last
        })
        seen = set(frontier)
        while frontier:
            g = frontier.pop()
            for u in self.members[g]:
                for v in self.graph.succs[u]:
                    h = self.find(v)
                    if h in start:
                        return True
                    if h not in seen and self.members[h][0] < last:
                        seen.add(h)
                        frontier.append(h)
        return False

    def plan(self, name: str) -> FusionPlan:
        return FusionPlan.from_groups(self.members.values(), name)
