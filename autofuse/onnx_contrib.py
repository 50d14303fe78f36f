"""onnxruntime's com.microsoft operators that its transformer optimizer writes, as Relax ops.

Models published already optimised for onnxruntime (BERT-like exports run through
`onnxruntime.transformers.optimizer`, 4-bit LLM and encoder exports) hold contrib operators:
Gelu, FastGelu, BiasGelu, QuickGelu, FusedMatMul, SkipLayerNormalization,
SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization (an RMS norm that onnxruntime
registers in the ONNX domain), Attention (QKV in one weight), MultiHeadAttention,
RotaryEmbedding, MatMulNBits (4-bit weights), DynamicQuantizeLSTM (what onnxruntime's
quantize_dynamic makes of an LSTM), and EmbedLayerNormalization, which TVM's frontend converts
itself. TVM's frontend dispatches on the operator's name alone, ignoring its domain,
so a contrib node could meet a standard operator's converter of the same name (com.microsoft's
RotaryEmbedding and Attention take other inputs than ONNX's). `tag` therefore renames each
contrib node to "com.microsoft.<op>" before import, and only the names CONVERTERS holds are
accepted. Each becomes what onnxruntime's contrib operator documentation says it computes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from tvm import relax

from autofuse.onnx_composites import rotary_embedding
from autofuse.onnx_composites import swish
from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import const_like
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import heads_first
from autofuse.onnx_converters import is_const
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_shape
from autofuse.onnx_rnn import lstm

DOMAIN = "com.microsoft"


def tag(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with each com.microsoft node renamed "com.microsoft.<op>", and how many; the
    model itself where it has none."""
    if not any(n.domain == DOMAIN for n in model.graph.node):
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    count = 0
    for node in out.graph.node:
        if node.domain == DOMAIN:
            node.op_type = f"{DOMAIN}.{node.op_type}"  # the domain stays: onnx's checker skips it
            count += 1
    return out, count


def _gelu(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """Gelu, or BiasGelu's gelu(A + B): erf's GELU, which normalisation spells out (VectorMath)."""
    x = inputs[0] if len(inputs) < 2 else bb.emit(relax.op.add(inputs[0], inputs[1]))
    return bb.emit(relax.op.nn.gelu(x))


def _fast_gelu(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """tanh's GELU, the optional bias added first."""
    x, bias = inputs[0], optional_input(inputs, 1, params)
    return bb.emit(relax.op.nn.gelu_tanh(x if bias is None else bb.emit(relax.op.add(x, bias))))


def _quick_gelu(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """x sigmoid(alpha x) (CLIP's activation): ONNX's Swish with another default alpha."""
    return swish(bb, inputs[0], float(attr.get("alpha", 1.702)))


def _swap_last(x: relax.Expr) -> relax.Expr:
    ndim = x.ty.ndim
    return relax.op.permute_dims(x, [*range(ndim - 2), ndim - 1, ndim - 2])


def _fused_matmul(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """alpha * op(A) @ op(B), op a transpose of the last two axes where transA/transB say."""
    if int(attr.get("transBatchA", 0)) or int(attr.get("transBatchB", 0)):
        raise ValueError("FusedMatMul: transBatchA/transBatchB are not supported")
    a, b = inputs[0], inputs[1]
    if int(attr.get("transA", 0)):
        a = bb.emit(_swap_last(a))
    if int(attr.get("transB", 0)):
        b = bb.emit(_swap_last(b))
    y = bb.emit(relax.op.matmul(a, b))
    alpha = float(attr.get("alpha", 1.0))
    return y if alpha == 1.0 else bb.emit(relax.op.multiply(y, const_like(alpha, y)))


def _skip_sum(bb: relax.BlockBuilder, inputs: list, params: list, bias_at: int) -> relax.Expr:
    x = bb.emit(relax.op.add(inputs[0], inputs[1]))
    bias = optional_input(inputs, bias_at, params)
    return x if bias is None else bb.emit(relax.op.add(x, bias))


def _with_statistics(y: relax.Expr, attr: dict, total: relax.Expr | None = None) -> relax.Expr:
    """Output 0 alone, or with (mean, inv_std_var[, input_skip_bias_sum]) after it, as many as
    the node has: the statistics are training outputs that nothing reads (`read_statistics`
    refuses a model where something does), so zeros stand in for them."""
    outputs = int(attr["tvm_custom"].get("num_outputs", 1))
    if outputs == 1:
        return y
    zero = relax.const(0.0, str(y.ty.dtype))
    return relax.Tuple([y, zero, zero, total][:outputs])


def _skip_layer_norm(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """LayerNorm(input + skip + bias) with gamma and the optional beta."""
    total = _skip_sum(bb, inputs, params, 4)
    gamma, beta = inputs[2], optional_input(inputs, 3, params)
    if beta is None:
        beta = relax.op.zeros_like(gamma)
    y = bb.emit(relax.op.nn.layer_norm(total, gamma, beta, axes=-1, epsilon=float(attr.get("epsilon", 1e-12))))
    return _with_statistics(y, attr, total)


def _skip_simplified_layer_norm(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """RMSNorm(input + skip + bias) * gamma."""
    total = _skip_sum(bb, inputs, params, 3)
    y = bb.emit(relax.op.nn.rms_norm(total, inputs[2], axes=-1, epsilon=float(attr.get("epsilon", 1e-12))))
    return _with_statistics(y, attr, total)


def _simplified_layer_norm(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """ONNX's RMSNormalization (opset 23), which onnxruntime had first under this name."""
    from tvm.relax.frontend.onnx.onnx_frontend import RMSNormalization

    return _with_statistics(bb.normalize(RMSNormalization._impl_v23(bb, inputs, attr, params)), attr)


# outputs the normalisations above do not compute: statistics kept for training
STATISTICS = {"SkipLayerNormalization": (1, 2), "SkipSimplifiedLayerNormalization": (1, 2),
              "SimplifiedLayerNormalization": (1,)}


def read_statistics(model: onnx.ModelProto) -> set[int]:
    """Positions of the normalisation nodes whose statistics outputs a node or the graph reads."""
    read = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    read.discard("")
    return {k for k, node in enumerate(model.graph.node)
            if node.domain in (DOMAIN, "", "ai.onnx") and node.op_type in STATISTICS
            and any(i < len(node.output) and node.output[i] in read for i in STATISTICS[node.op_type])}


def _attend(
    bb: relax.BlockBuilder, q: relax.Expr, k: relax.Expr, v: relax.Expr, mask: relax.Expr | None,
    attention_bias: relax.Expr | None, attr: dict, op: str,
) -> relax.Expr:
    """softmax(Q K^T * scale + mask) V for [batch, heads, seq, size] Q, K and V, as
    [batch, seq, heads * size]. The mask as onnxruntime's contrib attention takes it: [batch]
    key lengths (from EmbedLayerNormalization), [batch, keys] of 1/0, or [batch, queries,
    keys]; masked scores get mask_filter_value (-10000) added, as there, and under
    `unidirectional` future keys are left out (-inf)."""
    b, heads, s, size = static_shape(q)  # type: ignore[misc]
    keys = static_shape(k)[2]  # type: ignore[index]
    dtype = str(q.ty.dtype)
    scale = float(attr.get("scale", 0.0)) or 1 / math.sqrt(size)
    scores = bb.emit(relax.op.multiply(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])),
                                       relax.const(scale, dtype)))
    if attention_bias is not None:
        scores = bb.emit(relax.op.add(scores, attention_bias))
    if mask is not None:
        shape = static_shape(mask)
        if shape == (b,):
            lengths = relax.op.reshape(relax.op.astype(mask, "int64"), [b, 1, 1])
            keep = relax.op.less(array_const(np.arange(keys, dtype="int64").reshape(1, 1, keys)), lengths)
        elif shape in ((b, keys), (b, s, keys)):
            keep = relax.op.not_equal(mask, relax.const(0, str(mask.ty.dtype)))
            keep = relax.op.reshape(keep, [b, 1, keys]) if len(shape) == 2 else keep
        else:
            raise ValueError(f"{op}: a mask of shape {shape} is not supported")
        filler = relax.const(float(attr.get("mask_filter_value", -10000.0)), dtype)
        # the same for every head, the filler added where masked
        scores = bb.emit(relax.op.add(scores, relax.op.where(relax.op.expand_dims(keep, 1),
                                                             relax.const(0.0, dtype), filler)))
    if int(attr.get("unidirectional", 0)):
        future = np.where(np.tril(np.ones((s, keys), bool), keys - s), 0.0, -np.inf).astype(dtype)
        scores = bb.emit(relax.op.add(scores, array_const(future)))
    y = bb.emit(relax.op.matmul(relax.op.nn.softmax(scores, axis=-1), v))
    return bb.emit(relax.op.reshape(relax.op.permute_dims(y, [0, 2, 1, 3]), [b, s, heads * static_shape(v)[3]]))


def _attention(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """com.microsoft's Attention: the Q, K and V projections in one weight [in, 3 hidden] plus
    bias, then attention over the heads (`_attend`)."""
    x, weight, bias = inputs[0], inputs[1], optional_input(inputs, 2, params)
    if any(optional_input(inputs, i, params) is not None for i in range(4, 8)) or attr.get("qkv_hidden_sizes"):
        raise ValueError("Attention: past state, attention bias and qkv_hidden_sizes are not supported")
    if int(attr["tvm_custom"].get("num_outputs", 1)) > 1:
        raise ValueError("Attention: the present state output is not supported")
    heads = int(attr["num_heads"])
    hidden = static_shape(weight)[1] // 3  # type: ignore[index]
    qkv = bb.emit(relax.op.matmul(x, weight))
    if bias is not None:
        qkv = bb.emit(relax.op.add(qkv, bias))
    q, k, v = (heads_first(bb, bb.emit(relax.op.strided_slice(qkv, [2], [i * hidden], [(i + 1) * hidden])), heads)
               for i in range(3))
    return _attend(bb, q, k, v, optional_input(inputs, 3, params), None, attr, "Attention")


def _multi_head_attention(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """com.microsoft's MultiHeadAttention with separate [batch, seq, hidden] query, key and
    value (cross-attention included), the optional bias of all three concatenated, the key
    padding mask and an additive attention bias; no past state."""
    q, k, v = inputs[0], optional_input(inputs, 1, params), optional_input(inputs, 2, params)
    bias, mask, attention_bias = (optional_input(inputs, i, params) for i in (3, 4, 5))
    if k is None or v is None or any(optional_input(inputs, i, params) is not None for i in range(6, 10)):
        raise ValueError("MultiHeadAttention: packed QKV and past state are not supported")
    if int(attr["tvm_custom"].get("num_outputs", 1)) > 1:
        raise ValueError("MultiHeadAttention: the present state outputs are not supported")
    if any(len(static_shape(t) or ()) != 3 for t in (q, k, v)):
        raise ValueError("MultiHeadAttention: query, key and value must be [batch, seq, hidden]")
    if bias is not None:
        sizes = [static_shape(t)[2] for t in (q, k, v)]  # type: ignore[index]
        starts = np.cumsum([0, *sizes])
        q, k, v = (bb.emit(relax.op.add(t, relax.op.strided_slice(bias, [0], [int(lo)], [int(hi)])))
                   for t, lo, hi in zip((q, k, v), starts[:-1], starts[1:]))
    heads = int(attr["num_heads"])
    q, k, v = (heads_first(bb, t, heads) for t in (q, k, v))
    return _attend(bb, q, k, v, mask, attention_bias, attr, "MultiHeadAttention")


def _rotary_embedding(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """com.microsoft's RotaryEmbedding: ONNX's (onnx_composites.rotary_embedding) with its
    inputs in another order, (input, position_ids, cos_cache, sin_cache), and position_ids
    either [batch, seq] or a [1] offset of positions 0..seq-1."""
    x, positions, cos, sin = inputs[0], optional_input(inputs, 1, params), inputs[2], inputs[3]
    if float(attr.get("scale", 1.0)) != 1.0 or int(attr.get("is_packed_batching", 0)):
        raise ValueError("RotaryEmbedding: scale and packed batching are not supported")
    shape = static_shape(x)
    if shape is None or positions is None:
        raise ValueError("RotaryEmbedding: the input needs a static shape and position_ids")
    b, s = shape[0], shape[-2] if len(shape) == 4 else shape[1]
    if static_shape(positions) in ((1,), ()):  # an offset
        steps = array_const(np.arange(s, dtype="int64").reshape(1, s))
        offset = relax.op.reshape(relax.op.astype(positions, "int64"), [1, 1])
        positions = bb.emit(relax.op.broadcast_to(relax.op.add(steps, offset), [b, s]))
    return rotary_embedding(bb, [x, cos, sin, positions], attr, params)


def _matmul_nbits(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """A @ W (+ bias) with W stored in `bits`-bit blocks (4-bit LLM and encoder exports): the
    constant weights dequantized at import, (q - zero point) * scale per block of K, and the
    node becomes a float matmul the search fuses like any other. The weights then take 32/bits
    times their memory; the arithmetic is the same as onnxruntime's float path."""
    a = inputs[0]
    packed, scales, zeros, g_idx, bias = (optional_input(inputs, i, params) for i in (1, 2, 3, 4, 5))
    if not (is_const(packed) and is_const(scales) and (zeros is None or is_const(zeros))):
        raise ValueError("MatMulNBits: the quantized weights, scales and zero points must be constants")
    if g_idx is not None:
        raise ValueError("MatMulNBits: g_idx (act-order groups) is not supported")
    k, n, bits, block = (int(attr[name]) for name in ("K", "N", "bits", "block_size"))
    q = _unpack(packed.value.numpy().reshape(n, -1), bits)  # [N, blocks * block]
    blocks = q.shape[1] // block
    scale = scales.value.numpy().reshape(n, blocks).astype(np.float32)
    if zeros is None:
        zero = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    elif str(zeros.ty.dtype) == "uint8":
        zero = _unpack(zeros.value.numpy().reshape(n, -1), bits)[:, :blocks].astype(np.float32)
    else:
        zero = zeros.value.numpy().reshape(n, blocks).astype(np.float32)
    w = (q.reshape(n, blocks, block) - zero[:, :, None]) * scale[:, :, None]
    w = w.reshape(n, blocks * block)[:, :k].T.astype(str(a.ty.dtype))  # [K, N]
    y = bb.emit(relax.op.matmul(a, array_const(np.ascontiguousarray(w))))
    return y if bias is None else bb.emit(relax.op.add(y, bias))


def _dynamic_quantize_lstm(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """An LSTM with int8 weights W [directions, input, 4 hidden] and R [directions, hidden,
    4 hidden], per direction or per column scales and zero points: the weights dequantized at
    import, (q - zero point) * scale, into the LSTM's [directions, 4 hidden, input] layout, and
    the node becomes a float LSTM. onnxruntime also quantizes X and the hidden state to 8 bits at
    every step; here they stay float, so the outputs differ from onnxruntime's by about that
    rounding (the import's onnxruntime check reports it) and match the float LSTM with the
    dequantized weights. (Computed as onnxruntime does, step by step, the int8 CRNN came within
    0.018 of onnxruntime's outputs rather than 0.11, but each fusion plan then differed from the
    unfused one by as much: a last-bit difference in a fused kernel rounds a quantized hidden
    state to the next integer, and that compounds over the steps, so the plan check rejected
    every fused plan.)"""
    weights = []
    for q_at, scale_at, zero_at in ((1, 8, 9), (2, 10, 11)):
        q, scale, zero = (optional_input(inputs, i, params) for i in (q_at, scale_at, zero_at))
        if not (is_const(q) and is_const(scale) and (zero is None or is_const(zero))):
            raise ValueError("DynamicQuantizeLSTM: the quantized weights, scales and zero points must be constants")
        values = q.value.numpy().astype(np.float32)  # [directions, rows, 4 hidden]
        s, z = (_per_direction(a, values.shape[0]) for a in (scale, zero))
        weights.append(array_const(np.ascontiguousarray(((values - z) * s).transpose(0, 2, 1))))
    return lstm(bb, [inputs[0], *weights, *inputs[3:8]], attr, params)


def _per_direction(param: relax.Constant | None, directions: int) -> np.ndarray | float:
    """A scale or zero point (one value, one per direction or one per direction and column)
    shaped to broadcast over [directions, rows, columns]."""
    if param is None:
        return 0.0
    a = param.value.numpy().astype(np.float32)
    return a.reshape(1, 1, 1) if a.size == 1 else a.reshape(directions, 1, -1)


def _unpack(data: np.ndarray, bits: int) -> np.ndarray:
    """Rows of packed `bits`-bit unsigned values, least significant bits first."""
    if bits == 8:
        return data.astype(np.int32)
    values = np.unpackbits(data.astype(np.uint8), axis=-1, bitorder="little")  # 8 bits a byte, LSB first
    values = values.reshape(*data.shape[:-1], -1, bits)
    return (values * (1 << np.arange(bits))).sum(-1).astype(np.int32)


def _stock(op: str) -> type:
    """The frontend's own converter for contrib operator `op` (TVM's ONNX frontend has
    com.microsoft's EmbedLayerNormalization under its bare name)."""

    def convert(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
        from tvm.relax.frontend.onnx import onnx_frontend

        return getattr(onnx_frontend, op).get_converter(1)(bb, inputs, attr, params)

    return converter(op, {1: convert})


# onnxruntime registers SimplifiedLayerNormalization in the ONNX domain: it keeps its name
CONVERTERS: dict[str, type] = {
    f"{DOMAIN}.Gelu": converter("Gelu", {1: _gelu}),
    f"{DOMAIN}.BiasGelu": converter("BiasGelu", {1: _gelu}),
    f"{DOMAIN}.FastGelu": converter("FastGelu", {1: _fast_gelu}),
    f"{DOMAIN}.QuickGelu": converter("QuickGelu", {1: _quick_gelu}),
    f"{DOMAIN}.FusedMatMul": converter("FusedMatMul", {1: _fused_matmul}),
    f"{DOMAIN}.SkipLayerNormalization": converter("SkipLayerNormalization", {1: _skip_layer_norm}),
    f"{DOMAIN}.SkipSimplifiedLayerNormalization": converter("SkipSimplifiedLayerNormalization",
                                                            {1: _skip_simplified_layer_norm}),
    f"{DOMAIN}.Attention": converter("Attention", {1: _attention}),
    f"{DOMAIN}.MultiHeadAttention": converter("MultiHeadAttention", {1: _multi_head_attention}),
    f"{DOMAIN}.EmbedLayerNormalization": _stock("EmbedLayerNormalization"),
    f"{DOMAIN}.RotaryEmbedding": converter("RotaryEmbedding", {1: _rotary_embedding}),
    f"{DOMAIN}.MatMulNBits": converter("MatMulNBits", {1: _matmul_nbits}),
    f"{DOMAIN}.DynamicQuantizeLSTM": converter("DynamicQuantizeLSTM", {1: _dynamic_quantize_lstm}),
    "SimplifiedLayerNormalization": converter("SimplifiedLayerNormalization", {1: _simplified_layer_norm}),
}
