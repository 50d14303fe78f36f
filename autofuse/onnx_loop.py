"""ONNX Loop nodes with a constant trip count, and Scan nodes of a fixed length, unrolled before import.

TVM's Relax frontend has neither a Loop nor a Scan converter. A scripted PyTorch `for i in
range(n)` (or a TensorFlow while loop with a fixed count) exports as a Loop whose trip count is
a constant and whose condition never changes; older exporters (TensorFlow's tf2onnx, Keras
RNNs) write recurrences as a Scan over a sequence axis, whose length the importer's fixed input
shapes determine. With autofuse's static shapes either is just its body n times. Each
iteration's copy of the body reads the previous one's loop-carried values (a Scan's also its
element of each scanned input, a Gather); scan outputs are stacked along their axis
(Unsqueeze + Concat), as the operators define them. The fusion search then sees the unrolled
body like any other chain of operators. A Loop whose count or condition is computed at run
time, or a Scan over an axis of unknown length, is left as it is (and named as unsupported).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    """`model` with its top-level constant-count Loops and fixed-length Scans unrolled (nested
    ones as they surface), and how many; the model itself where there are none."""
    if not any(n.op_type in ("Loop", "Scan") for n in model.graph.node):
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 1)
    count = 0
    for _ in range(MAX_TRIPS):  # a Loop inside a body surfaces when its parent is unrolled
        constants = constant_tensors(out.graph)
        lengths = _scan_lengths(out) if any(n.op_type == "Scan" for n in out.graph.node) else {}
        nodes, changed = [], False
        for k, node in enumerate(out.graph.node):
            tag = f"{node.name or node.op_type.lower()}{k}"
            unrolled = None
            if node.op_type == "Loop":
                unrolled = _unrolled_loop(node, constants, tag, opset)
            elif node.op_type == "Scan" and node.domain in ("", "ai.onnx"):
                unrolled = _unrolled_scan(node, lengths, tag, opset)
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


def _unrolled_loop(
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
        nodes.append(_scalar(prefix + "iteration", np.array(i, np.int64)))
        names[body.input[1].name] = prefix + "condition"
        nodes.append(_scalar(prefix + "condition", np.array(True)))
        for value, now in zip(body.input[2:], carried):
            names[value.name] = now
        outputs = _copy_body(body, names, prefix, nodes)
        carried = outputs[1:1 + n_carried]
        for k in range(scans):
            stacked[k].append(outputs[1 + n_carried + k])
    for k, name in enumerate(loop.output[n_carried:]):
        if name:
            _stack(stacked[k], name, 0, f"{tag}__scan{k}", opset, nodes, inits)
    return _finals(loop.output[:n_carried], carried, tag, nodes), inits


def _unrolled_scan(
    scan: onnx.NodeProto, lengths: dict[str, int], tag: str, opset: int
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]] | None:
    """The nodes and initializers replacing a Scan (opset 9 on: no batch axis), or None where it
    cannot be unrolled. Iteration t reads element t (the last first, for a reverse direction)
    of each scan input along its axis, a Gather of one index, which drops that axis as the body
    expects; scan outputs are stacked along their axes, prepended for a reverse direction."""
    if opset < 9:
        return None
    attrs = {a.name: a for a in scan.attribute}
    body = attrs["body"].g
    m = attrs["num_scan_inputs"].i
    n_state = len(scan.input) - m
    k_out = len(body.output) - n_state
    in_axes = _ints(attrs, "scan_input_axes", m)
    in_reverse = _ints(attrs, "scan_input_directions", m)
    out_axes = _ints(attrs, "scan_output_axes", k_out)
    out_reverse = _ints(attrs, "scan_output_directions", k_out)
    seqs = list(scan.input[n_state:])
    steps = {lengths.get(f"{x}:{axis}") for x, axis in zip(seqs, in_axes)}
    if len(steps) != 1 or None in steps:
        return None
    trips = steps.pop()
    if not 0 < trips <= MAX_TRIPS or trips * len(body.node) > MAX_UNROLLED_NODES:
        return None
    nodes: list[onnx.NodeProto] = []
    shared = {t.name: f"{tag}__{t.name}" for t in body.initializer}
    inits = [renamed(t, shared[t.name]) for t in body.initializer]
    carried = list(scan.input[:n_state])
    stacked: list[list[str]] = [[] for _ in range(k_out)]
    for i in range(trips):
        prefix = f"{tag}__it{i}__"
        names = dict(shared)
        for value, now in zip(body.input[:n_state], carried):
            names[value.name] = now
        for j, (x, axis, reverse) in enumerate(zip(seqs, in_axes, in_reverse)):
            index, element = f"{prefix}index{j}", f"{prefix}element{j}"
            nodes.append(_scalar(index, np.array(trips - 1 - i if reverse else i, np.int64)))
            nodes.append(helper.make_node("Gather", [x, index], [element], name=element, axis=axis))
            names[body.input[n_state + j].name] = element
        outputs = _copy_body(body, names, prefix, nodes)
        carried = outputs[:n_state]
        for k in range(k_out):
            stacked[k].append(outputs[n_state + k])
    for k, name in enumerate(scan.output[n_state:]):
        if name:
            rows = stacked[k][::-1] if out_reverse[k] else stacked[k]
            _stack(rows, name, out_axes[k], f"{tag}__scan{k}", opset, nodes, inits)
    return _finals(scan.output[:n_state], carried, tag, nodes), inits


def _scan_lengths(model: onnx.ModelProto) -> dict[str, int]:
    """'value:axis' -> that axis's length, for every top-level Scan's scan inputs whose shape
    ONNX's shape inference knows (the importer's fixed input shapes make most of them known)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # a model shape inference rejects: its Scans stay as they are
        return {}
    shapes = {}
    for v in [*inferred.input, *inferred.value_info, *inferred.output]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    lengths = {}
    for node in model.graph.node:
        if node.op_type != "Scan":
            continue
        attrs = {a.name: a for a in node.attribute}
        m = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
        axes = _ints(attrs, "scan_input_axes", m)
        for x, axis in zip(node.input[len(node.input) - m:], axes):
            shape = shapes.get(x)
            if shape and -len(shape) <= axis < len(shape) and shape[axis]:
                lengths[f"{x}:{axis}"] = shape[axis]
    return lengths


def _ints(attrs: dict[str, onnx.AttributeProto], name: str, n: int) -> list[int]:
    """A Scan's per-input or per-output integer attribute (axes, directions); zeros by default."""
    return list(attrs[name].ints) if name in attrs else [0] * n


def _scalar(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value))


def _copy_body(body: onnx.GraphProto, names: dict[str, str], prefix: str, nodes: list[onnx.NodeProto]) -> list[str]:
    """Append one iteration's copy of `body` to `nodes` (its values renamed with `prefix`, its
    inputs read as `names` maps them); the names its outputs have in that copy."""
    for j, node in enumerate(body.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + (node.name or f"{node.op_type}{j}")
        for k, name in enumerate(copy.output):
            if name:
                names[name] = copy.output[k] = prefix + name
        rename_inputs(copy, names)
        nodes.append(copy)
    return [names.get(o.name, o.name) for o in body.output]


def _stack(values: list[str], name: str, axis: int, tag: str, opset: int,
           nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> None:
    """`name` = the per-iteration `values` stacked along a new `axis` (Unsqueeze + Concat)."""
    rows = []
    for i, value in enumerate(values):
        rows.append(f"{tag}_{i}")
        if opset >= 13:
            axes = f"{tag}__axes"
            if i == 0:
                inits.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
            nodes.append(helper.make_node("Unsqueeze", [value, axes], [rows[-1]], name=rows[-1]))
        else:
            nodes.append(helper.make_node("Unsqueeze", [value], [rows[-1]], name=rows[-1], axes=[axis]))
    nodes.append(helper.make_node("Concat", rows, [name], name=f"{tag}__{name}", axis=axis))


def _finals(names: Sequence[str], values: list[str], tag: str, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` with the loop-carried values' last iteration copied to the node's outputs."""
    for name, value in zip(names, values):
        if name:
            nodes.append(helper.make_node("Identity", [value], [name], name=f"{tag}__{name}"))
    return nodes


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
