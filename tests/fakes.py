"""A measurer with a known latency function, for testing the search without timing noise."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from autofuse.build import MeasureConfig
from autofuse.graph import OpGraph
from autofuse.measure import Measurement
from autofuse.plan import FusionPlan


class FakeMeasurer:
    """Latency = sum over groups of (launch overhead + per-op work), with a penalty for groups
    holding several anchors and a bonus for fusing a reduction into its consumer."""

    def __init__(self, graph: OpGraph, overhead_s: float = 10e-6) -> None:
        self.graph, self.overhead_s = graph, overhead_s
        self.config = MeasureConfig()
        self.calls: list[str] = []

    def group_s(self, group: tuple[int, ...]) -> float:
        nodes = [self.graph.nodes[n] for n in group]
        work = sum(1e-6 + n.bytes_out / 1e9 for n in nodes)
        anchors = sum(n.is_anchor for n in nodes)
        if anchors > 1:
            work *= 3.0
        members = set(group)
        if any(n.is_reduction and any(s in members for s in self.graph.succs[n.id]) for n in nodes):
            work *= 0.7
        return self.overhead_s + work

    def latency_s(self, plan: FusionPlan) -> float:
        return sum(self.group_s(g) for g in plan.groups)

    def measure(self, plan, config=None, time_groups=False, known_kernels=(), scheduler=None):
        self.calls.append(plan.key)
        kernels = tuple(hashlib.sha1(repr(g).encode()).hexdigest()[:16] for g in plan.groups)
        lat = {k: self.group_s(g) for k, g in zip(kernels, plan.groups) if k not in known_kernels}
        total = self.latency_s(plan)
        return Measurement(plan.key, "ok", latencies_s=(total,) * 5, compile_s=0.01,
                           max_abs_err=0.0, kernels=kernels,
                           kernel_latencies_s=lat if time_groups else {})


class DriftingMeasurer(FakeMeasurer):
    """FakeMeasurer on a host whose speed drifts: every second measurement's plan runs `slow`
    times slower, and reports TVM's plan timed beside it in the same spell (as
    IsolatedMeasurer.pair_with_default does); the kernels, timed alone after them, do not."""

    def __init__(self, graph: OpGraph, default: FusionPlan, slow: float = 1.6) -> None:
        super().__init__(graph)
        self.default, self.slow = default, slow
        self.plans: dict[str, FusionPlan] = {}

    def measure(self, plan, config=None, time_groups=False, known_kernels=(), scheduler=None):
        m = super().measure(plan, config, time_groups, known_kernels, scheduler)
        self.plans[plan.key] = plan
        spell = self.slow if len(self.calls) % 2 == 0 else 1.0
        return replace(
            m,
            latencies_s=tuple(t * spell for t in m.latencies_s),
            default_latencies_s=(self.latency_s(self.default) * spell,) * len(m.latencies_s),
        )
