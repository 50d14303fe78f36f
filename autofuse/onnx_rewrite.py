"""Renaming values in ONNX graphs, for the rewrites done before import (onnx_float16's casts at
the graph's edges, onnx_loop's unrolled bodies): a value read inside an If or Loop subgraph is
read by name from the enclosing scope, so a rename must reach into subgraphs, and stop where a
subgraph defines the same name itself."""

from __future__ import annotations

import onnx


def rename_inputs(node: onnx.NodeProto, names: dict[str, str]) -> None:
    """Rename the values `node` reads, and those its subgraphs read from the enclosing scope."""
    for k, name in enumerate(node.input):
        if name in names:
            node.input[k] = names[name]
    for a in node.attribute:
        for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            local = {i.name for i in sub.input} | {t.name for t in sub.initializer}
            local |= {o for n in sub.node for o in n.output}
            inner = {k: v for k, v in names.items() if k not in local}
            for n in sub.node:
                rename_inputs(n, inner)
            for o in sub.output:
                if o.name in inner:  # a subgraph output that is an outer value: read it renamed
                    o.name = inner[o.name]
