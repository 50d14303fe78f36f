"""ONNX's Attention operator (opsets 23 to 25) as the Relax ops it is made of.

PyTorch's exporter writes scaled_dot_product_attention as one `Attention` node when asked for
opset 23 or later; TVM's frontend maps that op name to com.microsoft's Attention (a fused QKV
projection with other inputs and attributes), and the import failed on a missing `num_heads`.
Here the node becomes what it computes, as the ONNX reference defines it: Q.K^T times the scale,
the optional softcap, the mask, causal and sliding-window (opset 25) bounds and an external
cache's lengths (opset 24's nonpad_kv_seqlen, known at run time) added as a bias, softmax (a row
no key may attend to gives zeros), times V, with grouped-query heads repeated and a past
key/value cache concatenated. Spelled as ordinary matmul, softmax and elementwise ops, the
fusion search sees the same attention chain as in a model exported at opset 18 (matmul ->
softmax -> matmul in one kernel, the mask an epilogue). ONNX's 93 conformance cases of the
operator pass (scripts/onnx_conformance.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tvm import relax

from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import element_dtype
from autofuse.onnx_converters import heads_first
from autofuse.onnx_converters import is_const
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_shape


def _error(name: str, problem: str) -> ValueError:
    return ValueError(f"Attention node {name!r}: {problem}")


def _convert(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    name = str(attr["tvm_custom"]["name"] or "<unnamed>")
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask, past_k, past_v, nonpad = (optional_input(inputs, i, params) for i in (3, 4, 5, 6))
    if nonpad is not None and past_k is not None:
        raise _error(name, "nonpad_kv_seqlen and past_key/past_value exclude each other")
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
    softcap = float(attr.get("softcap", 0.0))
    if softcap > 0:  # before the mask, so that masked scores stay -inf
        cap = relax.const(softcap, dtype)
        qk = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(qk, cap)), cap))
    window = Window(bool(int(attr.get("is_causal", 0))), int(attr.get("left_window_size", -1)),
                    int(attr.get("right_window_size", -1)), q_len, total, past)
    bias, masked_rows = _bias(bb, mask, window, nonpad, dtype, name)
    scores = qk if bias is None else bb.emit(relax.op.add(qk, bias))
    code = int(attr.get("softmax_precision", 0))  # an ONNX element type; 0: the inputs' own
    precision = element_dtype(code) if code else dtype
    cast = scores if precision == dtype else bb.emit(relax.op.astype(scores, precision))
    probs = bb.emit(relax.op.nn.softmax(cast, axis=-1))
    if masked_rows is not None:  # a row no key may attend to gives zeros, not NaN
        probs = bb.emit(relax.op.where(masked_rows, relax.const(0.0, precision), probs))
    if precision != dtype:
        probs = bb.emit(relax.op.astype(probs, dtype))
    y = bb.emit(relax.op.matmul(probs, v))
    if three_d:
        b, h, s, dv = static_shape(y)  # type: ignore[misc]
        y = bb.emit(relax.op.reshape(relax.op.permute_dims(y, [0, 2, 1, 3]), [b, s, h * dv]))
    outputs = int(attr["tvm_custom"].get("num_outputs", 1))
    if outputs == 1:
        return y
    # what ONNX's reference exposes: modes 0 and 1 the scaled (and softcapped) Q.K^T, 2 with the
    # mask added, 3 the softmax
    mode = int(attr.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise _error(name, f"qk_matmul_output_mode {mode} is not one of 0-3")
    return relax.Tuple([y, present_k, present_v, [qk, qk, scores, probs][mode]][:outputs])


@dataclass(frozen=True)
class Window:
    """Which keys a query may attend to by position: the query at row i sits at i + past (its
    absolute position), and key j is allowed where j <= i + past (causal) and it lies no more
    than `left` before nor `right` after it (-1: unbounded)."""

    causal: bool
    left: int
    right: int
    q_len: int
    total: int
    past: int

    def bounds(self, diff: object, at_least: Callable, at_most: Callable) -> list:
        """The conditions on diff = the query's position - the key's: `at_least(diff, n)` and
        `at_most(diff, n)` are numpy's comparisons, or Relax's where the offset is known at run
        time only."""
        out = [at_least(diff, 0)] if self.causal else []
        if self.left >= 0:
            out.append(at_most(diff, self.left))
        if self.right >= 0:
            out.append(at_least(diff, -self.right))
        return out

    def allowed(self) -> np.ndarray:
        """[q_len, total] booleans, the queries sitting after `past` keys."""
        diff = np.arange(self.q_len)[:, None] + self.past - np.arange(self.total)[None, :]
        return np.logical_and.reduce([np.ones(diff.shape, bool), *self.bounds(diff, np.greater_equal, np.less_equal)])

    @property
    def bounded(self) -> bool:
        return self.causal or self.left >= 0 or self.right >= 0


def _bias(
    bb: relax.BlockBuilder, mask: relax.Expr | None, window: Window, nonpad: relax.Expr | None, dtype: str,
    name: str,
) -> tuple[relax.Expr | None, relax.Expr | None]:
    """(additive bias, rows where it is -inf everywhere or None where there are none): the mask
    (a boolean one as 0 / -inf, one shorter than the keys padded with -inf), the causal and
    sliding-window bounds, and keys past each batch's nonpad_kv_seqlen; as ONNX's reference."""
    neg = relax.const(-np.inf, dtype)
    zero = relax.const(0.0, dtype)
    bias, known = None, np.zeros((1, 1), dtype)  # `known`: the bias's value where it is a constant
    if mask is not None:
        shape = static_shape(mask)
        if shape is None or not shape:
            raise _error(name, "attn_mask needs a static shape")
        padding = np.full([*shape[:-1], window.total - shape[-1]], -np.inf, dtype)
        if is_const(mask):  # computed here: no guard is left in the model where no row is masked
            value = mask.value.numpy()
            value = np.where(value, 0.0, -np.inf) if value.dtype == np.bool_ else value
            known = np.concatenate([value.astype(dtype), padding], axis=-1)
            mask = array_const(known)
        else:
            if str(mask.ty.dtype) == "bool":
                mask = bb.emit(relax.op.where(mask, zero, neg))
            elif str(mask.ty.dtype) != dtype:
                mask = bb.emit(relax.op.astype(mask, dtype))
            if padding.size:
                mask = bb.emit(relax.op.concat([mask, array_const(padding)], axis=-1))
            known = None
        bias = mask
    if nonpad is None:
        if window.bounded:
            allowed = window.allowed()
            bound = np.where(allowed, 0.0, -np.inf).astype(dtype)
            bias = array_const(bound) if bias is None else bb.emit(relax.op.add(bias, array_const(bound)))
            known = None if known is None else known + bound
    else:  # an external cache: batch b holds nonpad[b] keys, the queries are its last q_len
        lengths = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(nonpad, "int64")), [-1, 1, 1, 1]))
        keys = array_const(np.arange(window.total, dtype="int64").reshape(1, 1, 1, -1))
        allowed = bb.emit(relax.op.less(keys, lengths))
        if window.bounded:
            rows = array_const(np.arange(window.q_len, dtype="int64").reshape(1, 1, -1, 1))
            diff = bb.emit(relax.op.subtract(relax.op.add(rows, relax.op.subtract(lengths, relax.const(
                window.q_len, "int64"))), keys))
            at_least = lambda d, n: relax.op.greater_equal(d, relax.const(n, "int64"))  # noqa: E731
            at_most = lambda d, n: relax.op.less_equal(d, relax.const(n, "int64"))  # noqa: E731
            for ok in window.bounds(diff, at_least, at_most):
                allowed = bb.emit(relax.op.logical_and(allowed, bb.emit(ok)))
        bound = bb.emit(relax.op.where(allowed, zero, neg))
        bias = bound if bias is None else bb.emit(relax.op.add(bias, bound))
        known = None
    if bias is None:
        return None, None
    if known is not None:
        rows = np.isneginf(known.max(axis=-1, keepdims=True))
        return bias, (array_const(rows) if rows.any() else None)
    # max over the bias itself would not do: TVM's max starts from the type's lowest finite value
    open_ = bb.emit(relax.op.where(relax.op.equal(bias, neg), zero, relax.const(1.0, dtype)))
    return bias, bb.emit(relax.op.equal(relax.op.max(open_, axis=-1, keepdims=True), zero))


# ai.onnx's operator from opset 23 (com.microsoft's Attention, which the stock converter
# handles, is refused up front by the importer as a contrib-domain node)
CONVERTERS: dict[str, type] = {"Attention": converter("Attention", {23: _convert})}
