"""ONNX's integer operators (ConvInteger, MatMulInteger) rewritten as float Conv and MatMul.

onnxruntime's `quantize_dynamic`, the usual way to make a CPU model int8 without calibration,
writes each convolution and matmul as DynamicQuantizeLinear (the activations to uint8 with a
scale computed at run time) -> ConvInteger / MatMulInteger (int8 weights, an int32 result) ->
a cast and a multiply by the two scales. TVM imports the integer operators as they are, and its
int32 convolutions and matmuls get none of the register-tiled float kernels (ddddocr's int8
CRNN ran at 0.30x of onnxruntime, 0.67x after, in sweeps an hour apart). Each integer operator
computes a sum of products of small integers (the inputs less their zero points), which float32
holds exactly while a sum stays under 2^24; so each becomes the float operator on the shifted
values, cast back to int32 (unless the graph casts it on to float, a bias added), and the
rest of the graph is left as written: the constant weights' shift and cast fold at import, and
the model keeps its meaning, its quantized activations included. The rewrite is done on the
ONNX graph before import, as onnx_qlinear's, so onnxslim and onnxruntime see the same model.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto
from onnx import helper


def to_float(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(the model with its ConvInteger/MatMulInteger nodes as float ops, how many were rewritten).
    A node whose zero point is given per row of A (MatMulInteger) or per output channel of a
    weight of unknown rank is left to TVM's converter."""
    ranks = {i.name: len(i.dims) for i in model.graph.initializer}
    chains = _chains_to_float(model.graph)
    made = {o: n for n in model.graph.node for o in n.output}
    rounded = {n.output[0]: n.input[0] for n in model.graph.node  # int32 of a whole float -> that float
               if _cast_to(n) == TensorProto.INT32
               and getattr(made.get(n.input[0]), "op_type", None) in ("Floor", "Ceil", "Round")}
    nodes: list[onnx.NodeProto] = []
    count = 0
    floats: dict[str, str] = {}  # an int32 value of a rewritten chain -> the float value computed instead
    named: dict[str, str] = {}  # a chain's Add output -> the name of its float result
    dropped: set[str] = set()  # outputs of the chains' casts to float, now written by the float ops
    for node in model.graph.node:
        if node.op_type == "Cast" and node.output[0] in dropped:
            continue
        if node.op_type == "Add" and node.output[0] in named and any(i in floats for i in node.input):
            nodes.extend(_float_add(node, floats, named[node.output[0]], rounded))
            continue
        chain = chains.get(node.output[0]) if node.output else None
        into = None if chain is None else chain[1].output[0] if not chain[0] else f"{node.output[0]}/float"
        rewritten = _rewrite(node, ranks, into) if node.domain in ("", "ai.onnx") else None
        nodes.extend(rewritten or [node])
        count += rewritten is not None
        if rewritten and chain is not None:
            adds, cast = chain
            floats[node.output[0]] = into  # type: ignore[assignment]
            named.update({a.output[0]: f"{a.output[0]}/float" for a in adds[:-1]})
            if adds:
                named[adds[-1].output[0]] = cast.output[0]
            dropped.add(cast.output[0])
    if not count:
        return model, 0
    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, count


def _chains_to_float(graph: onnx.GraphProto) -> dict[str, tuple[list[onnx.NodeProto], onnx.NodeProto]]:
    """integer op output -> (the int32 Adds it flows through, the Cast to float that ends them),
    each value the only use of the one before. quantize_dynamic casts every ConvInteger or
    MatMulInteger result back to float, some after adding a bias quantized at run time to int32:
    the float op's exact integer result is what those compute, and the round trip through int32
    (a float -> int cast guards non-finite values with a select, which TVM 0.27's ConvertLayout
    cannot move) kept the convolutions' epilogues channels-first, behind transposes."""
    uses: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    chains = {}
    for node in graph.node:
        if node.op_type not in ("ConvInteger", "MatMulInteger"):
            continue
        value, adds = node.output[0], []
        while value not in outputs and len(uses.get(value, [])) == 1:
            use = uses[value][0]
            if use.op_type == "Add" and list(use.input).count(value) == 1 and len(use.input) == 2:
                adds.append(use)
                value = use.output[0]
                continue
            if _cast_to(use) == TensorProto.FLOAT:
                chains[node.output[0]] = (adds, use)
            break
    return chains


def _cast_to(node: onnx.NodeProto) -> int | None:
    """The element type a Cast node casts to (None for any other node)."""
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _float_add(node: onnx.NodeProto, floats: dict[str, str], out: str,
               rounded: dict[str, str]) -> list[onnx.NodeProto]:
    """A chain's int32 Add in float. Its other operand (the bias) is the float it was cast from
    where that was already a whole number (Floor, Ceil or Round: what quantize_dynamic's run-time
    bias quantization casts; ONNX leaves a cast out of int32's range undefined), else cast back
    to float: a float -> int32 cast's non-finite guard, a select, kept its whole chain
    channels-first."""
    mine = next(i for i in node.input if i in floats)
    other = next(i for i in node.input if i != mine)
    floats[node.output[0]] = out
    add = helper.make_node("Add", [floats[mine], rounded.get(other, f"{other}/float")], [out],
                           name=f"{node.name or node.output[0]}/float")
    if other in rounded:
        return [add]
    return [helper.make_node("Cast", [other], [f"{other}/float"], to=TensorProto.FLOAT), add]


def _rewrite(node: onnx.NodeProto, ranks: dict[str, int], into: str | None) -> list[onnx.NodeProto] | None:
    """The float op for an integer one, its result cast to int32; or its float result written
    to `into` (a chain's value, see _chains_to_float)."""
    if node.op_type not in ("ConvInteger", "MatMulInteger"):
        return None
    conv = node.op_type == "ConvInteger"
    inputs = list(node.input) + [""] * (4 - len(node.input))
    a, b, a_zero, b_zero = inputs
    if not conv and a_zero and ranks.get(a_zero, 0) > 0:
        return None  # A's zero point per row: rare, left to TVM
    if conv and b_zero and ranks.get(b_zero, 0) > 0 and b not in ranks:
        return None  # per output channel, the weight's rank unknown
    base = node.name or node.output[0]
    out: list[onnx.NodeProto] = []

    def shifted(x: str, zero: str, tag: str, channel_rank: int = 0) -> str:
        """x - zero in float; a per-channel zero point as [C, 1, ...] against a conv's weight."""
        xf = f"{base}/{tag}_float"
        out.append(helper.make_node("Cast", [x], [xf], to=TensorProto.FLOAT))
        if not zero:
            return xf
        zf = f"{base}/{tag}_zero_float"
        out.append(helper.make_node("Cast", [zero], [zf], to=TensorProto.FLOAT))
        if channel_rank > 1 and ranks.get(zero, 0) > 0:
            shape = f"{base}/{tag}_zero_shape"  # Reshape: the same in every opset since 5
            out.append(helper.make_node("Constant", [], [shape], value=helper.make_tensor(
                shape, TensorProto.INT64, [channel_rank], [-1] + [1] * (channel_rank - 1))))
            out.append(helper.make_node("Reshape", [zf, shape], [zf + "_per_channel"]))
            zf += "_per_channel"
        out.append(helper.make_node("Sub", [xf, zf], [f"{base}/{tag}_shifted"]))
        return f"{base}/{tag}_shifted"

    af = shifted(a, a_zero, "a")
    bf = shifted(b, b_zero, "b", ranks.get(b, 0) if conv else 0)
    y = into or f"{base}/float"
    out.append(helper.make_node("Conv" if conv else "MatMul", [af, bf], [y], name=f"{base}/{node.op_type[:-7]}",
                                **({at.name: helper.get_attribute_value(at) for at in node.attribute} if conv else {})))
    if into is None:
        out.append(helper.make_node("Cast", [y], [node.output[0]], to=TensorProto.INT32))
    return out
