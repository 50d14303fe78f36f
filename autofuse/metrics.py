"""Plan metrics from the mission: kernels, fusion ratio, intermediate bytes kept out of memory."""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

from autofuse.graph import OpGraph
from autofuse.plan import FusionPlan


@dataclass(frozen=True)
class PlanMetrics:
    kernels: int
    ops: int
    fusion_ratio: float  # ops inside multi-op groups / all ops
    bytes_saved: int  # bytes of tensors produced and consumed only inside one group
    largest_group: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def internal_nodes(graph: OpGraph, plan: FusionPlan) -> list[int]:
    """Nodes whose result never leaves their group: FuseTIR keeps these out of global memory."""
    group_of = plan.group_of()
    return [
        n.id
        for n in graph.nodes
        if n.id not in graph.outputs
        and graph.succs[n.id]
        and all(group_of[s] == group_of[n.id] for s in graph.succs[n.id])
    ]


def plan_metrics(graph: OpGraph, plan: FusionPlan) -> PlanMetrics:
    fused_ops = sum(len(g) for g in plan.groups if len(g) > 1)
    return PlanMetrics(
        kernels=plan.num_kernels,
        ops=len(graph),
        fusion_ratio=fused_ops / len(graph) if len(graph) else 0.0,
        bytes_saved=sum(graph.nodes[n].bytes_out for n in internal_nodes(graph, plan)),
        largest_group=max((len(g) for g in plan.groups), default=0),
    )
