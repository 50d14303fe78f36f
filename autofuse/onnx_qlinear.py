"""ONNX quantized operators in "QOperator" form, rewritten as DequantizeLinear -> float op -> QuantizeLinear.

onnxruntime's quantizer writes int8 models in one of two forms: QDQ (float operators between
DequantizeLinear and QuantizeLinear nodes, which TVM's ONNX frontend imports) and QOperator
(QLinearConv, QLinearMatMul and com.microsoft's QLinearAdd, QGemm, ...: one node per quantized
operator, which it does not). Each QOperator node computes exactly "dequantize the inputs, apply
the float operator, quantize the result" up to the rounding of its int32 accumulator, so
rewriting it in QDQ form keeps the model's meaning and lets it import; what the float operator
is, and which inputs are (tensor, scale, zero point) triples, is all that differs per operator.
The rewrite is done on the ONNX graph, before import, so that onnxslim, onnxruntime (the
reference and the baseline) and TVM all see the same model.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper


@dataclass(frozen=True)
class _Form:
    """How one QOperator node maps to its float operator.

    `triples`: input positions of (quantized tensor, scale, zero point) triples, in the float
    operator's input order; `axes`: per triple, the dequantization axis used when its scale has
    more than one element (per-channel weights: a convolution's output channels, a matmul's
    columns); `output`: positions of the output's (scale, zero point); `bias`: position of an
    int32 bias whose scale is the product of the scales of the first two triples;
    `variadic_from`: where a variadic list of triples starts (QLinearConcat's inputs).
    """

    op: str
    triples: tuple[int, ...]
    output: tuple[int, int]
    axes: tuple[int | None, ...] = ()
    bias: int | None = None
    variadic_from: int | None = None
    keep_attrs: tuple[str, ...] | None = None  # None: every attribute passes to the float op


_FORMS: dict[tuple[str, str], _Form] = {
    ("", "QLinearConv"): _Form("Conv", (0, 3), (6, 7), axes=(None, 0), bias=8),
    ("", "QLinearMatMul"): _Form("MatMul", (0, 3), (6, 7), axes=(-2, -1)),
    ("com.microsoft", "QLinearAdd"): _Form("Add", (0, 3), (6, 7)),
    ("com.microsoft", "QLinearMul"): _Form("Mul", (0, 3), (6, 7)),
    ("com.microsoft", "QLinearSigmoid"): _Form("Sigmoid", (0,), (3, 4)),
    ("com.microsoft", "QLinearLeakyRelu"): _Form("LeakyRelu", (0,), (3, 4)),
    ("com.microsoft", "QLinearGlobalAveragePool"): _Form("GlobalAveragePool", (0,), (3, 4), keep_attrs=()),
    ("com.microsoft", "QLinearAveragePool"): _Form(
        "AveragePool", (0,), (3, 4),
        keep_attrs=("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")),
    ("com.microsoft", "QLinearConcat"): _Form("Concat", (), (0, 1), variadic_from=2),
    # B's columns are its last axis, or its first when transB (handled in _rewrite)
    ("com.microsoft", "QGemm"): _Form("Gemm", (0, 3), (7, 8), axes=(None, -1), bias=6),
}


class QLinearError(ValueError):
    """A QOperator node this rewrite cannot express (one line naming the node)."""


def is_qoperator(node: onnx.NodeProto) -> bool:
    return ((node.domain or ""), node.op_type) in _FORMS


def to_qdq(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model with every QOperator node rewritten in QDQ form; returns (model, nodes rewritten).
    The model is returned unchanged (the same object) when it has none."""
    if not any(is_qoperator(n) for n in model.graph.node):
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    # element counts of constant scales: more than one means per-axis quantization
    sizes = {t.name: _numel(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            sizes[n.output[0]] = _numel(n.attribute[0].t.dims)
    opset = max((o.version for o in model.opset_import if (o.domain or "") in ("", "ai.onnx")), default=0)
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in model.graph.node:
        if is_qoperator(node):
            nodes.extend(_rewrite(node, sizes, opset))
            count += 1
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, count


def _numel(dims: object) -> int:
    n = 1
    for d in dims:  # type: ignore[attr-defined]
        n *= int(d)
    return n


def _rewrite(node: onnx.NodeProto, sizes: dict[str, int], opset: int) -> list[onnx.NodeProto]:
    form = _FORMS[((node.domain or ""), node.op_type)]
    ins = list(node.input)
    name = node.name or f"{node.op_type}_{node.output[0]}"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.pop("channels_last", 0):
        raise QLinearError(f"{name} ({node.op_type}): channels_last=1 is not supported")
    if node.op_type == "QGemm":
        if float(attrs.get("alpha", 1.0)) != 1.0 and len(ins) > 6 and ins[6]:
            raise QLinearError(f"{name} (QGemm): a bias with alpha != 1 is not supported")
        form = _Form(form.op, form.triples, form.output, (None, 0 if attrs.get("transB", 0) else -1), form.bias)
    out: list[onnx.NodeProto] = []

    def arg(i: int) -> str:
        return ins[i] if i < len(ins) else ""

    def dequantize(x: int, axis: int | None, tag: str) -> str:
        scale, zero = arg(x + 1), arg(x + 2)
        y = f"{name}__{tag}"
        kw = {"axis": axis} if axis is not None and sizes.get(scale, 1) > 1 else {}
        if kw and opset < 13:
            raise QLinearError(f"{name} ({node.op_type}): per-channel scales need ai.onnx opset 13 or later")
        out.append(helper.make_node("DequantizeLinear", [ins[x], scale] + ([zero] if zero else []), [y],
                                    name=f"{y}_dq", **kw))
        return y

    floats: list[str] = []
    if form.variadic_from is not None:
        for k, x in enumerate(range(form.variadic_from, len(ins), 3)):
            floats.append(dequantize(x, None, f"in{k}"))
    for k, x in enumerate(form.triples):
        floats.append(dequantize(x, form.axes[k] if k < len(form.axes) else None, f"in{k}"))
    if form.bias is not None and arg(form.bias):
        a_scale, b_scale = arg(form.triples[0] + 1), arg(form.triples[1] + 1)
        bias_scale = f"{name}__bias_scale"
        out.append(helper.make_node("Mul", [a_scale, b_scale], [bias_scale], name=f"{bias_scale}_mul"))
        bias = f"{name}__bias"
        kw = {"axis": 0} if sizes.get(b_scale, 1) > 1 else {}
        out.append(helper.make_node("DequantizeLinear", [arg(form.bias), bias_scale], [bias], name=f"{bias}_dq", **kw))
        floats.append(bias)
    if form.keep_attrs is not None:
        attrs = {k: v for k, v in attrs.items() if k in form.keep_attrs}
    if not arg(form.output[0]):  # QGemm without y_scale: a float output
        out.append(helper.make_node(form.op, floats, [node.output[0]], name=f"{name}__float", **attrs))
        return out
    y = f"{name}__float"
    out.append(helper.make_node(form.op, floats, [y], name=y, **attrs))
    scale, zero = arg(form.output[0]), arg(form.output[1])
    out.append(helper.make_node("QuantizeLinear", [y, scale] + ([zero] if zero else []), [node.output[0]],
                                name=f"{name}__q"))
    return out
