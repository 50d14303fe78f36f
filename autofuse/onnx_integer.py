"""ONNX's integer operators (ConvInteger, MatMulInteger) rewritten as float Conv and MatMul.

onnxruntime's `quantize_dynamic`, the usual way to make a CPU model int8 without calibration,
writes each convolution and matmul as DynamicQuantizeLinear (the activations to uint8 with a
scale computed at run time) -> ConvInteger / MatMulInteger (int8 weights, an int32 result) ->
a cast and a multiply by the two scales. TVM imports the integer operators as they are, and its
int32 convolutions and matmuls get none of the register-tiled float kernels (ddddocr's int8
CRNN ran at 0.30x of onnxruntime, 0.67x after, in sweeps an hour apart). Each integer operator
computes a sum of products of small integers (the inputs less their zero points), which float32
holds exactly while a sum stays under 2^24; so each becomes the float operator on the shifted
values, cast back to int32 (unless the graph casts it straight on to float), and the rest of the
graph is left as written: the constant weights' shift and cast fold at import, and the model
keeps its meaning, its quantized activations included. The rewrite is
done on the ONNX graph before import, as onnx_qlinear's, so onnxslim and onnxruntime see the
same model.
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
    back = _cast_back_to_float(model.graph)
    nodes: list[onnx.NodeProto] = []
    count = 0
    merged: set[str] = set()  # outputs of the casts back to float that the float ops now write
    for node in model.graph.node:
        if node.op_type == "Cast" and node.output[0] in merged:
            continue
        rewritten = _rewrite(node, ranks, back) if node.domain in ("", "ai.onnx") else None
        nodes.extend(rewritten or [node])
        count += rewritten is not None
        if rewritten and node.output[0] in back:
            merged.add(back[node.output[0]])
    if not count:
        return model, 0
    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, count


def _cast_back_to_float(graph: onnx.GraphProto) -> dict[str, str]:
    """integer op output -> the output of the Cast to float that is its only use. quantize_dynamic
    casts every ConvInteger/MatMulInteger result straight back to float: the float op's exact
    integer result is that cast's value, and the round trip through int32 in between (a float ->
    int cast guards non-finite values with a select, which TVM 0.27's ConvertLayout cannot move)
    kept the int8 CRNN's convolution epilogues channels-first, behind transposes."""
    uses: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    back = {}
    for node in graph.node:
        if node.op_type not in ("ConvInteger", "MatMulInteger") or node.output[0] in outputs:
            continue
        found = uses.get(node.output[0], [])
        to = [a.i for a in found[0].attribute if a.name == "to"] if len(found) == 1 else []
        if found and found[0].op_type == "Cast" and to == [TensorProto.FLOAT]:
            back[node.output[0]] = found[0].output[0]
    return back


def _rewrite(node: onnx.NodeProto, ranks: dict[str, int], back: dict[str, str]) -> list[onnx.NodeProto] | None:
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
    y = back.get(node.output[0], f"{base}/float")
    out.append(helper.make_node("Conv" if conv else "MatMul", [af, bf], [y], name=f"{base}/{node.op_type[:-7]}",
                                **({at.name: helper.get_attribute_value(at) for at in node.attribute} if conv else {})))
    if node.output[0] not in back:
        out.append(helper.make_node("Cast", [y], [node.output[0]], to=TensorProto.INT32))
    return out
