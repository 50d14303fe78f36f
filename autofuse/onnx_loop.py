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

from autofuse.onnx_constants import constant_tensors
from autofuse.onnx_constants import renamed
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
        constants = constant_tensors(out.graph)
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


def _value(constants: dict[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    """The first element of constant `name` (a trip count, a condition), None if not constant."""
    return numpy_helper.to_array(constants[name]).reshape(-1)[0] if name in constants else None


def _unrolled(
    loop: onnx.NodeProto, constants: dict[str, onnx.TensorProto], tag: str, opset: int
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]] | None:
    """The nodes and initializers replacing `loop`, or None where it cannot be unrolled."""
    body = next(a.g for a in loop.attribute if a.name == "body")
    trips = _value(constants, loop.input[0])
    cond = _value(constants, loop.input[1]) if len(loop.input) > 1 and loop.input[1] else True
    if trips is None or cond is None or not bool(cond):
        return None
    trips = int(trips)
    carried = list(loop.input[2:])
    n_carried = len(carried)
    scans = len(body.output) - 1 - n_carried
    if not 0 < trips <= MAX_TRIPS or trips * len(body.node) > MAX_UNROLLED_NODES or not _always_true(body, constants):
        return None
    nodes: list[onnx.NodeProto] = []
    shared = {t.name: f"{tag}__{t.name}" for t in body.initializer}  # the body's weights, once for all
    inits = [renamed(t, shared[t.name]) for t in body.initializer]
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
        carried = outputs[1:1 + n_carried]
        for k in range(scans):
            stacked[k].append(outputs[1 + n_carried + k])
    finals = list(loop.output)
    for name, value in zip(finals, carried):
        if name:
            nodes.append(helper.make_node("Identity", [value], [name], name=f"{tag}__{name}"))
    for k, name in enumerate(finals[n_carried:]):
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


def _always_true(body: onnx.GraphProto, constants: dict[str, onnx.TensorProto]) -> bool:
    """Whether the body's condition output is, through Identity nodes, its condition input
    passed on or a constant true (made in the body, or read from the enclosing graph as
    TorchScript's export does)."""
    cond_in, name = body.input[1].name, body.output[0].name
    producers = {o: n for n in body.node for o in n.output}
    while name in producers and producers[name].op_type == "Identity":
        name = producers[name].input[0]
    if name == cond_in:
        return True
    if name in producers and producers[name].op_type != "Constant":  # computed in the body
        return False
    value = _value({**constants, **constant_tensors(body)}, name)
    return value is not None and bool(value)
