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


def fold(model: onnx.ModelProto, unsupported: Callable[[onnx.NodeProto], bool]) -> tuple[onnx.ModelProto, int]:
    """`model` with each top-level node that `unsupported` flags and whose inputs are all
    constants replaced by its values, and how many; the model itself where there are none."""
    known = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            known[node.output[0]] = node.attribute[0].t
    todo = [k for k, n in enumerate(model.graph.node)
            if unsupported(n) and all(not i or i in known for i in n.input) and not _has_subgraph(n)]
    if not todo:
        return model, 0
    from onnx.reference import ReferenceEvaluator

    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    folded = 0
    opsets = list(out.opset_import)
    for k in todo:
        node = nodes[k]
        names = [i for i in node.input if i]
        graph = helper.make_graph(
            [node], "fold", [], [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output],
            [_renamed(known[i], i) for i in dict.fromkeys(names)])
        try:
            values = ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(None, {})
        except Exception:  # the reference has no such operator either: left for the importer to name
            continue
        nodes[k] = [helper.make_node("Constant", [], [o], name=f"{node.name or node.op_type}__folded{j}",
                                     value=numpy_helper.from_array(v, o))
                    for j, (o, v) in enumerate(zip(node.output, values)) if o]
        folded += 1
    del out.graph.node[:]
    for n in nodes:
        out.graph.node.extend(n if isinstance(n, list) else [n])
    return out, folded


def _renamed(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
