"""The operator graph: one node per kernel call of a legalized Relax module, pure Python.

Everything downstream of the TVM adapter (plans, search space, cost model, search) works on
this type, so it carries all that those stages need (kinds, shapes, FLOPs, bytes) and no live
TVM object. Reachability is kept as Python-int bitsets: convexity checks on graphs of a few
thousand nodes stay cheap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any


class OpKind(IntEnum):
    """TVM's OpPatternKind, as AnnotateTIROpPattern writes it into each PrimFunc."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCE = 3
    OUT_EWISE_FUSABLE = 4  # conv, matmul, ...: the "anchor" of a fused kernel
    TUPLE = 7
    OPAQUE = 8

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class OpNode:
    """One `call_tir` binding of the main dataflow block.

    `fusable` is False for kernels no group may contain with anything else (opaque kernels);
    they are always singleton groups. Tuple-output kernels (split) fuse, with the indexing of
    their results moved into the group.
    """

    id: int
    name: str  # the Relax variable bound to the call
    op: str  # the PrimFunc's name
    kind: OpKind
    shape: tuple[int, ...]
    dtype: str
    flops: float
    bytes_in: int  # bytes of all tensor arguments (weights included)
    bytes_out: int
    fusable: bool = True

    @property
    def is_anchor(self) -> bool:
        return self.kind == OpKind.OUT_EWISE_FUSABLE

    @property
    def is_reduction(self) -> bool:
        return self.kind == OpKind.REDUCE


@dataclass(frozen=True)
class OpGraph:
    """Nodes in the module's binding order (a topological order) and tensor-dependency edges.

    `outputs` are the nodes whose result leaves the dataflow block: they must stay outputs of
    whichever group holds them. `input_readers` lists, per model input, the nodes that read it
    (siblings for horizontal fusion that no node edge shows).
    """

    nodes: tuple[OpNode, ...]
    edges: tuple[tuple[int, int], ...]
    outputs: frozenset[int] = frozenset()
    input_readers: tuple[tuple[int, ...], ...] = ()  # per function parameter: nodes reading it

    def __post_init__(self) -> None:
        for i, node in enumerate(self.nodes):
            if node.id != i:
                raise ValueError(f"node ids must be 0..n-1 in order, got {node.id} at {i}")
        for src, dst in self.edges:
            if not 0 <= src < dst < len(self.nodes):
                raise ValueError(f"edge {src}->{dst} is not forward in binding order")

    def __len__(self) -> int:
        return len(self.nodes)

    def _adjacency(self, pairs: Iterable[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
        out: list[set[int]] = [set() for _ in self.nodes]
        for a, b in pairs:
            out[a].add(b)
        return tuple(tuple(sorted(s)) for s in out)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        return self._adjacency(self.edges)

    @cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        return self._adjacency((dst, src) for src, dst in self.edges)

    @cached_property
    def descendants(self) -> tuple[int, ...]:
        """Bitset per node of all nodes reachable from it (itself excluded)."""
        reach = [0] * len(self.nodes)
        for u in reversed(range(len(self.nodes))):  # ids are topologically ordered
            for v in self.succs[u]:
                reach[u] |= (1 << v) | reach[v]
        return tuple(reach)

    @cached_property
    def ancestors(self) -> tuple[int, ...]:
        reach = [0] * len(self.nodes)
        for v in range(len(self.nodes)):
            for u in self.preds[v]:
                reach[v] |= (1 << u) | reach[u]
        return tuple(reach)

    @cached_property
    def roles(self) -> tuple[int, ...]:
        """Per node, a label equal for nodes that play the same part in repeated blocks (the
        same matmul in each layer of a transformer): its op, shape and dtype and those of its
        neighbours up to two edges away either way (Weisfeiler-Lehman refinement, two rounds).
        Labels are numbered in order of first appearance, so they do not depend on the process."""

        def relabel(keys: list[Any]) -> list[int]:
            seen: dict[Any, int] = {}
            return [seen.setdefault(k, len(seen)) for k in keys]

        label = relabel([(n.op, n.shape, n.dtype, n.fusable) for n in self.nodes])
        for _ in range(2):
            label = relabel([(label[i], tuple(sorted(label[p] for p in self.preds[i])),
                              tuple(sorted(label[s] for s in self.succs[i]))) for i in range(len(label))])
        return tuple(label)

    def independent(self, a: int, b: int) -> bool:
        """True when neither node depends on the other (candidates for horizontal fusion)."""
        return not (self.descendants[a] >> b) & 1 and not (self.descendants[b] >> a) & 1

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for node in self.nodes:
            kinds[node.kind.label] = kinds.get(node.kind.label, 0) + 1
        return {
            "nodes": len(self.nodes),
            "edges": len(self.edges),
            "kinds": kinds,
            "gflops": sum(n.flops for n in self.nodes) / 1e9,
            "anchors": sum(n.is_anchor for n in self.nodes),
        }

    def to_json(self) -> str:
        data = {
            "nodes": [{**asdict(n), "kind": int(n.kind)} for n in self.nodes],
            "edges": [list(e) for e in self.edges],
            "outputs": sorted(self.outputs),
            "input_readers": [list(r) for r in self.input_readers],
        }
        return json.dumps(data)

    @staticmethod
    def from_json(text: str) -> OpGraph:
        data = json.loads(text)
        nodes = tuple(
            OpNode(**{**n, "kind": OpKind(n["kind"]), "shape": tuple(n["shape"])})
            for n in data["nodes"]
        )
        edges = tuple((int(a), int(b)) for a, b in data["edges"])
        readers = tuple(tuple(r) for r in data.get("input_readers", []))
        return OpGraph(nodes, edges, frozenset(data["outputs"]), readers)
