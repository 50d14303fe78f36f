"""Operators TVM's frontend lacks, evaluated at import where all their inputs are constants.

A spectrogram front end's MelWeightMatrix, a window or a Range over fixed sizes compute a
constant: whatever operator makes it, the model only needs its value. onnxslim folds constants
through onnxruntime where it can; an operator neither it nor TVM handles would stop the import
("unsupported operator") though its output never depends on the model's inputs. Such a node is
evaluated here once with ONNX's reference implementation and replaced by Constant nodes.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper
from onnx import numpy_helper


def constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The values `graph` fixes, by name: its initializers and its Constant nodes' tensors."""
    known = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            known[node.output[0]] = node.attribute[0].t
    return known


FOUR_BIT = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
# element types TVM has no type for, or casts to and from otherwise than ONNX (float8's FNUZ
# variants, saturation and NaN): ONNX's Cast conformance cases read silently different numbers
NARROW = frozenset(getattr(onnx.TensorProto, name) for name in (
    "INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
    "FLOAT8E5M2FNUZ", "FLOAT8E8M0") if hasattr(onnx.TensorProto, name))


def narrow_values(graph: onnx.GraphProto) -> list[str]:
    """The graph's inputs, constants and casts of a NARROW element type, as 'name (type)'. Run
    after `fold`, which dequantizes the 4-bit constants a DequantizeLinear reads at import."""
    def kind(code: int) -> str:
        return onnx.TensorProto.DataType.Name(code).lower()

    out = [f"input {v.name} ({kind(v.type.tensor_type.elem_type)})" for v in graph.input
           if v.type.tensor_type.elem_type in NARROW]
    out += [f"constant {name} ({kind(t.data_type)})" for name, t in constant_tensors(graph).items()
            if t.data_type in NARROW]
    for node in graph.node:
        to = next((a.i for a in node.attribute if a.name in ("to", "output_dtype")), None)
        if to in NARROW:
            out.append(f"{node.name or node.op_type} ({node.op_type} to {kind(to)})")
    return out


def reads_four_bits(graph: onnx.GraphProto) -> Callable[[onnx.NodeProto], bool]:
    """Whether a node reads a 4-bit constant (int4/uint4: a blocked-quantized weight's
    DequantizeLinear), a type TVM's frontend cannot hold: such a node is folded at import."""
    narrow = {name for name, t in constant_tensors(graph).items() if t.data_type in FOUR_BIT}
    return lambda node: any(i in narrow for i in node.input)


def renamed(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


def fold(model: onnx.ModelProto, unsupported: Callable[[onnx.NodeProto], bool]) -> tuple[onnx.ModelProto, int]:
    """`model` with each top-level node that `unsupported` flags and whose inputs are all
    constants replaced by its values, and how many; the model itself where there are none.
    One pass in the graph's (topological) order: a folded value counts as a constant for the
    nodes after it."""
    from onnx.reference import ReferenceEvaluator

    known = constant_tensors(model.graph)
    nodes: list[onnx.NodeProto] = []
    folded = 0
    for node in model.graph.node:
        inputs = [i for i in node.input if i]
        if not unsupported(node) or _has_subgraph(node) or not all(i in known for i in inputs):
            nodes.append(node)
            continue
        outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output]
        graph = helper.make_graph([node], "fold", [], outputs, [renamed(known[i], i) for i in dict.fromkeys(inputs)])
        try:
            values = ReferenceEvaluator(helper.make_model(graph, opset_imports=model.opset_import)).run(None, {})
        except Exception:  # the reference has no such operator either: left for the importer to name
            nodes.append(node)
            continue
        for j, (name, value) in enumerate(zip(node.output, values)):
            if name:
                known[name] = numpy_helper.from_array(value, name)
                nodes.append(helper.make_node("Constant", [], [name], name=f"{node.name or node.op_type}__folded{j}",
                                              value=known[name]))
        folded += 1
    if not folded:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    # the constants only folded nodes read go too (a 4-bit weight the frontend cannot hold)
    read = names_read(out.graph) | {o.name for o in out.graph.output}
    kept = [t for t in out.graph.initializer if t.name in read]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out, folded


def names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of `graph` or of its subgraphs (which may read the outer scope) reads."""
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                names |= names_read(sub)
    return names


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
