"""ONNX's Attention operator (opsets 23 and 24) as the Relax ops it is made of.

PyTorch's exporter writes scaled_dot_product_attention as one `Attention` node when asked for
opset 23 or later; TVM's frontend maps that op name to com.microsoft's Attention (a fused QKV
projection with other inputs and attributes), and the import failed on a missing `num_heads`.
Here the node becomes what it computes, as the ONNX reference defines it: Q.K^T times the scale,
the optional softcap, the mask and causal bias added, softmax, times V, with grouped-query heads
repeated and a past key/value cache concatenated. Spelled as ordinary matmul, softmax and
elementwise ops, the fusion search sees the same attention chain as in a model exported at
opset 18 (matmul -> softmax -> matmul in one kernel, the mask an epilogue).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import heads_first
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_shape

# ONNX TensorProto element types a softmax_precision attribute may name
_PRECISION = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}


def _error(name: str, problem: str) -> ValueError:
    return ValueError(f"Attention node {name!r}: {problem}")


def _convert(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    name = str(attr["tvm_custom"]["name"] or "<unnamed>")
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask, past_k, past_v, nonpad = (optional_input(inputs, i, params) for i in (3, 4, 5, 6))
    if nonpad is not None:
        raise _error(name, "nonpad_kv_seqlen (an external KV cache's lengths) is not supported")
    shapes = [static_shape(t) for t in (q, k, v)]
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1 or len(shapes[0]) not in (3, 4):
        raise _error(name, "Q, K and V need static shapes of one rank, 3 or 4")
    three_d = len(shapes[0]) == 3
    if three_d:
        if "q_num_heads" not in attr or "kv_num_heads" not in attr:
            raise _error(name, "3-D Q, K, V need the q_num_heads and kv_num_heads attributes")
        q_heads, kv_heads = int(attr["q_num_heads"]), int(attr["kv_num_heads"])
        q, k, v = heads_first(bb, q, q_heads), heads_first(bb, k, kv_heads), heads_first(bb, v, kv_heads)
    q_heads, q_len, head = static_shape(q)[1:]  # type: ignore[index]
    kv_heads = static_shape(k)[1]  # type: ignore[index]
    dtype = str(q.ty.dtype)
    past = 0
    if past_k is not None and past_v is not None:
        past = static_shape(past_k)[2]  # type: ignore[index]
        k = bb.emit(relax.op.concat([past_k, k], axis=2))
        v = bb.emit(relax.op.concat([past_v, v], axis=2))
    elif past_k is not None or past_v is not None:
        raise _error(name, "past_key and past_value come together")
    present_k, present_v = k, v
    total = static_shape(k)[2]  # type: ignore[index]
    if q_heads != kv_heads:
        if q_heads % kv_heads:
            raise _error(name, f"{q_heads} query heads are no multiple of {kv_heads} key/value heads")
        k = bb.emit(relax.op.repeat(k, q_heads // kv_heads, axis=1))  # [h0, h0, h1, h1, ...]
        v = bb.emit(relax.op.repeat(v, q_heads // kv_heads, axis=1))
    scale = float(attr.get("scale", 1.0 / np.sqrt(head)))
    qk = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])))
    qk = bb.emit(relax.op.multiply(qk, relax.const(scale, dtype)))
    raw = qk
    softcap = float(attr.get("softcap", 0.0))
    if softcap > 0:  # before the mask, so that masked scores stay -inf
        cap = relax.const(softcap, dtype)
        qk = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(qk, cap)), cap))
    bias = _bias(bb, mask, bool(int(attr.get("is_causal", 0))), q_len, total, past, dtype, name)
    if bias is not None:
        qk = bb.emit(relax.op.add(qk, bias))
    precision = _PRECISION.get(int(attr.get("softmax_precision", 0)), dtype)
    scores = qk if precision == dtype else bb.emit(relax.op.astype(qk, precision))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    if precision != dtype:
        probs = bb.emit(relax.op.astype(probs, dtype))
    y = bb.emit(relax.op.matmul(probs, v))
    if three_d:
        b, h, s, dv = static_shape(y)  # type: ignore[misc]
        y = bb.emit(relax.op.reshape(relax.op.permute_dims(y, [0, 2, 1, 3]), [b, s, h * dv]))
    outputs = int(attr["tvm_custom"].get("num_outputs", 1))
    if outputs == 1:
        return y
    mode = int(attr.get("qk_matmul_output_mode", 0))
    if outputs > 3 and mode not in (0, 3):
        raise _error(name, f"qk_matmul_output_mode {mode} is not supported (0: the scaled Q.K^T, 3: the softmax)")
    return relax.Tuple([y, present_k, present_v, raw if mode == 0 else probs][:outputs])


def _bias(
    bb: relax.BlockBuilder, mask: relax.Expr | None, causal: bool, q_len: int, total: int, past: int, dtype: str,
    name: str,
) -> relax.Expr | None:
    """The additive bias: the mask (a boolean one as 0 / -inf, one shorter than the keys padded
    with -inf) plus, where causal, -inf above the diagonal offset by the past keys."""
    bias = None
    if mask is not None:
        shape = static_shape(mask)
        if shape is None or not shape:
            raise _error(name, "attn_mask needs a static shape")
        if str(mask.ty.dtype) == "bool":
            zero, neg = relax.const(0.0, dtype), relax.const(-np.inf, dtype)
            mask = bb.emit(relax.op.where(mask, zero, neg))
        elif str(mask.ty.dtype) != dtype:
            mask = bb.emit(relax.op.astype(mask, dtype))
        if shape[-1] < total:
            pad = array_const(np.full([*shape[:-1], total - shape[-1]], -np.inf, dtype))
            mask = bb.emit(relax.op.concat([mask, pad], axis=-1))
        bias = mask
    if causal:
        allowed = np.arange(total)[None, :] <= np.arange(q_len)[:, None] + past
        tri = array_const(np.where(allowed, 0.0, -np.inf).astype(dtype))
        bias = tri if bias is None else bb.emit(relax.op.add(bias, tri))
    return bias


# ai.onnx's operator from opset 23 (com.microsoft's Attention, which the stock converter
# handles, is refused up front by the importer as a contrib-domain node)
CONVERTERS: dict[str, type] = {"Attention": converter("Attention", {23: _convert})}
