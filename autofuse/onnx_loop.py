"""ONNX Loop nodes with a constant trip count, unrolled before import.

TVM's Relax frontend has no Loop converter. A scripted PyTorch `for i in range(n)` (or a
TensorFlow while loop with a fixed count) exports as a Loop whose trip count is a constant and
whose condition never changes; with autofuse's static shapes such a loop is just its body n
times. Each iteration's copy of the body reads the previous one's loop-carried values; scan
outputs are stacked along a new first axis (Unsqueeze + Concat), as Loop defines them. The
fusion search then sees the unrolled body like any other chain of operators. A Loop whose count
or condition is computed at run time is left as it is (and named as unsupported).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

from autofuse.onnx_rewrite import rename_inputs

MAX_TRIPS = 256
MAX_UNROLLED_NODES = 20_000


def unroll(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with its top-level constant-count Loops unrolled (nested ones as they surface),
    and how many; the model itself where there are none."""
    if not any(n.op_type == "Loop" for n in model.graph.node):
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 1)
    count = 0
    for _ in range(MAX_TRIPS):  # a Loop inside a body surfaces when its parent is unrolled
        constants = _constants(out.graph)
        nodes, changed = [], False
        for k, node in enumerate(out.graph.node):
            is_loop = node.op_type == "Loop"
            unrolled = _unrolled(node, constants, f"{node.name or 'loop'}{k}", opset) if is_loop else None
            if unrolled is None:
                nodes.append(node)
            else:
                nodes.extend(unrolled[0])
                out.graph.initializer.extend(unrolled[1])
                count, changed = count + 1, True
        if not changed:
            break
        del out.graph.node[:]
        out.graph.node.extend(nodes)
    return out, count


def _constants(graph: onnx.GraphProto) -> dict[str, object]:
    """Values the graph fixes: initializers and Constant nodes' tensors."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _unrolled(
    loop: onnx.NodeProto, constants: dict[str, object], tag: str, opset: int
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]] | None:
    """The nodes and initializers replacing `loop`, or None where it cannot be unrolled."""
    body = next(a.g for a in loop.attribute if a.name == "body")
    trips = constants.get(loop.input[0]) if loop.input[0] else None
    cond = constants.get(loop.input[1]) if len(loop.input) > 1 and loop.input[1] else True
    if trips is None or cond is None or not bool(cond):
        return None
    trips = int(trips.reshape(-1)[0])  # type: ignore[attr-defined]
    carried = list(loop.input[2:])
    scans = len(body.output) - 1 - len(carried)
    if not 0 < trips <= MAX_TRIPS or trips * len(body.node) > MAX_UNROLLED_NODES or not _always_true(body, constants):
        return None
    nodes: list[onnx.NodeProto] = []
    inits = []
    shared = {t.name: f"{tag}__{t.name}" for t in body.initializer}  # the body's weights, once for all
    for t in body.initializer:
        inits.append(numpy_helper.from_array(numpy_helper.to_array(t), shared[t.name]))
    stacked: list[list[str]] = [[] for _ in range(scans)]
    for i in range(trips):
        prefix = f"{tag}__it{i}__"
        names = dict(shared)
        names[body.input[0].name] = prefix + "iteration"
        nodes.append(helper.make_node("Constant", [], [prefix + "iteration"], name=prefix + "iteration",
                                      value=numpy_helper.from_array(np.array(i, np.int64))))
        names[body.input[1].name] = prefix + "condition"
        nodes.append(helper.make_node("Constant", [], [prefix + "condition"], name=prefix + "condition",
                                      value=numpy_helper.from_array(np.array(True))))
        for value, now in zip(body.input[2:], carried):
            names[value.name] = now
        for j, node in enumerate(body.node):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = prefix + (node.name or f"{node.op_type}{j}")
            for k, name in enumerate(copy.output):
                if name:
                    names[name] = copy.output[k] = prefix + name
            rename_inputs(copy, names)
            nodes.append(copy)
        outputs = [names.get(o.name, o.name) for o in body.output]
        carried = outputs[1:1 + len(carried)]
        for k in range(scans):
            stacked[k].append(outputs[1 + len(loop.input[2:]) + k])
    finals = list(loop.output)
    for name, value in zip(finals, carried):
        if name:
            nodes.append(helper.make_node("Identity", [value], [name], name=f"{tag}__{name}"))
    for k, name in enumerate(finals[len(carried):]):
        if not name:
            continue
        rows = []
        for i, value in enumerate(stacked[k]):
            rows.append(f"{tag}__scan{k}_{i}")
            if opset >= 13:
                axes = f"{tag}__axes0"
                if i == 0 and k == 0:
                    inits.append(numpy_helper.from_array(np.zeros(1, np.int64), axes))
                nodes.append(helper.make_node("Unsqueeze", [value, axes], [rows[-1]], name=rows[-1]))
            else:
                nodes.append(helper.make_node("Unsqueeze", [value], [rows[-1]], name=rows[-1], axes=[0]))
        nodes.append(helper.make_node("Concat", rows, [name], name=f"{tag}__{name}", axis=0))
    return nodes, inits


def _always_true(body: onnx.GraphProto, constants: dict[str, object]) -> bool:
    """Whether the body's condition output is its condition input passed on, or a constant true
    (made in the body, or read from the enclosing graph as TorchScript's export does)."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    if cond_out == cond_in:
        return True
    producer = next((n for n in body.node if cond_out in n.output), None)
    if producer is None:
        value = constants.get(cond_out)
        return value is not None and bool(value.reshape(-1)[0])  # type: ignore[attr-defined]
    if producer.op_type == "Identity":
        source = producer.input[0]
        if source == cond_in:
            return True
        inner = next((n for n in body.node if source in n.output), None)
        value = constants.get(source) if inner is None else None
        return value is not None and bool(value.reshape(-1)[0])  # type: ignore[attr-defined]
    if producer.op_type == "Constant" and producer.attribute and producer.attribute[0].name == "value":
        return bool(numpy_helper.to_array(producer.attribute[0].t).reshape(-1)[0])
    return False
