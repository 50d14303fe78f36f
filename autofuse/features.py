"""Features of a fused group, for the cost model: fixed length, from the OpGraph alone.

A group's cost depends on what it computes (FLOPs, op kinds, anchors, reductions), what it
moves (bytes in and out of the kernel, intermediate bytes kept inside) and how it iterates
(loop extents). Everything but the GPU resource numbers is computable before building, so the model can
screen plans that were never compiled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from autofuse.graph import OpGraph
from autofuse.graph import OpKind
from autofuse.plan import group_kinds

KINDS = (
    OpKind.ELEMWISE,
    OpKind.BROADCAST,
    OpKind.INJECTIVE,
    OpKind.REDUCE,
    OpKind.OUT_EWISE_FUSABLE,
    OpKind.OPAQUE,
)
FEATURE_NAMES = (
    "ops",
    *(f"kind_{k.label}" for k in KINDS),
    "anchors",
    "reductions_with_consumers",
    "log_flops",
    "log_bytes_in",
    "log_bytes_out",
    "log_bytes_saved",
    "log_max_extent",
    "log_max_extent_anchor",
    "max_ndim",
    "dtype_bits",
    "horizontal",
    "external_outputs",
    "arith_intensity",
    "target_cuda",
    # known only once a CUDA kernel is built (gpu_resources); missing (NaN) otherwise, which
    # XGBoost routes by a learned default: unbuilt plans can still be screened
    "gpu_registers",
    "log_gpu_spill_bytes",
    "log_gpu_smem_bytes",
)
RESOURCE_FEATURES = 3


def _log(x: float) -> float:
    return math.log2(1.0 + max(x, 0.0))


def group_features(
    graph: OpGraph, group: Sequence[int], target_kind: str, resources: Mapping[str, int] | None = None
) -> list[float | None]:
    """One row of FEATURE_NAMES for `group` (node ids) of `graph` on a target kind; `resources`
    is the built kernel's GPU usage (gpu_resources.KernelResources.to_dict()), if known."""
    members = set(group)
    nodes = [graph.nodes[n] for n in group]
    internal_bytes = 0  # bytes produced and consumed inside the group
    saved = 0  # bytes of results that never leave the group
    external_out = 0
    leaves = 0
    for n in nodes:
        inside = [s for s in graph.succs[n.id] if s in members]
        internal_bytes += n.bytes_out * len(inside)
        leaves_group = n.id in graph.outputs or len(inside) < len(graph.succs[n.id])
        if leaves_group or not graph.succs[n.id]:
            external_out += n.bytes_out
            leaves += 1
        else:
            saved += n.bytes_out
    bytes_in = max(0, sum(n.bytes_in for n in nodes) - internal_bytes)
    flops = sum(n.flops for n in nodes)
    extents = [math.prod(n.shape) if n.shape else 1 for n in nodes]
    anchor_extents = [e for e, n in zip(extents, nodes) if n.is_anchor]
    bits = 16 if any(n.dtype in ("float16", "bfloat16") for n in nodes) else 32
    if any(n.dtype in ("float64", "int64") for n in nodes):
        bits = 64
    kinds = group_kinds(graph, group) if len(group) > 1 else set()
    return [
        float(len(nodes)),
        *(float(sum(n.kind == k for n in nodes)) for k in KINDS),
        float(sum(n.is_anchor for n in nodes)),
        float(sum(n.is_reduction and any(s in members for s in graph.succs[n.id]) for n in nodes)),
        _log(flops),
        _log(bytes_in),
        _log(external_out),
        _log(saved),
        _log(max(extents, default=1)),
        _log(max(anchor_extents, default=0)),
        float(max((len(n.shape) for n in nodes), default=0)),
        float(bits),
        float("horizontal" in kinds),
        float(leaves),
        flops / max(1.0, bytes_in + external_out),
        float(target_kind == "cuda"),
        *_resource_features(resources),
    ]


def group_rows(
    graph: OpGraph,
    groups: Sequence[Sequence[int]],
    kernels: Sequence[str],
    target_kind: str,
    resources: Mapping[str, Mapping[str, int]],
) -> list[dict[str, Any]]:
    """The per-group part of a log record: nodes, kernel hash (None where the build did not get
    that far) and features, with GPU resources where the kernel was built for CUDA."""
    out = []
    for i, group in enumerate(groups):
        kernel = kernels[i] if i < len(kernels) else None
        feats = group_features(graph, group, target_kind, resources.get(kernel) if kernel else None)
        out.append({"nodes": list(group), "kernel": kernel, "features": feats})
    return out


def _resource_features(resources: Mapping[str, int] | None) -> list[float | None]:
    if not resources:
        return [None] * RESOURCE_FEATURES
    return [float(resources["registers"]), _log(resources["spill_bytes"]), _log(resources["smem_bytes"])]
