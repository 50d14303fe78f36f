"""ONNX's DFT operator as one matmul with a constant matrix.

TVM's Relax ONNX frontend has no DFT converter, so a model with a Fourier transform (FNet's token
mixing, a spectrogram front end) would not import. With shapes fixed, the length N along the
transformed axis is known and the transform is a linear map: each output frequency k is
sum_t x[t] * exp(-+2*pi*i*t*k/L). Written over interleaved (real, imaginary) pairs it is one
real matmul by a constant (2N x 2M) matrix (N x 2M for real input), which the kernels schedule
like any projection with constant weights; no complex type, no new kernel. O(N^2) work against
an FFT's O(N log N), which pays at the lengths models transform along a hidden or token axis
(hundreds); a matrix over MAX_MATRIX_BYTES is refused with a one-line error instead.
"""

from __future__ import annotations

import functools

import numpy as np
from tvm import relax

from autofuse.onnx_converters import converter
from autofuse.onnx_converters import is_const
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_shape

MAX_MATRIX_BYTES = 256 << 20


def dft_matrix(n: int, length: int, onesided: bool, inverse: bool, complex_input: bool) -> np.ndarray:
    """The real matrix W with [x_re, x_im interleaved] @ W = [X_re, X_im interleaved]: inputs
    past `length` are dropped (the ONNX dft_length truncates), a shorter input is zero padded
    (its missing rows would multiply zeros), and an inverse transform is scaled by 1/length."""
    m = length // 2 + 1 if onesided else length
    t = np.arange(min(n, length), dtype=np.int64)[:, None]
    k = np.arange(m, dtype=np.int64)[None, :]
    angle = 2 * np.pi * ((t * k) % length) / length  # the product reduced exactly before the float
    scale = 1.0 / length if inverse else 1.0
    cos, sin = np.cos(angle) * scale, np.sin(angle) * (scale if inverse else -scale)
    # (x_re + i x_im)(cos + i sin) = (x_re cos - x_im sin) + i (x_re sin + x_im cos)
    w = np.zeros((n, 2 if complex_input else 1, m, 2))
    w[: len(t), 0, :, 0], w[: len(t), 0, :, 1] = cos, sin
    if complex_input:
        w[: len(t), 1, :, 0], w[: len(t), 1, :, 1] = -sin, cos
    return w.reshape(n * (2 if complex_input else 1), m * 2)


def _error(name: str, problem: str) -> ValueError:
    return ValueError(f"DFT node {name!r}: {problem}")


def _scalar(expr: relax.Expr | None, name: str, what: str) -> int | None:
    if expr is None:
        return None
    if not is_const(expr):
        raise _error(name, f"{what} is not a constant")
    return int(expr.value.numpy().reshape(-1)[0])


def _convert(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list, default_axis: int) -> relax.Expr:
    name = str(attr["tvm_custom"]["name"] or "<unnamed>")
    x = inputs[0]
    shape = static_shape(x)
    if shape is None:
        raise _error(name, "the input needs a static shape")
    rank = len(shape)
    if rank < 2 or shape[-1] not in (1, 2):
        raise _error(name, f"input shape {list(shape)} has no last axis of 1 (real) or 2 (complex)")
    length = _scalar(optional_input(inputs, 1, params), name, "dft_length")
    axis = _scalar(optional_input(inputs, 2, params), name, "axis")
    if axis is None:
        axis = int(attr.get("axis", default_axis))
    if not -rank <= axis <= rank - 2 or axis == -1:
        raise _error(name, f"axis {axis} is not a signal axis of a rank-{rank} input")
    axis %= rank
    onesided, inverse = bool(int(attr.get("onesided", 0))), bool(int(attr.get("inverse", 0)))
    complex_input = shape[-1] == 2
    if onesided and (inverse or complex_input):
        raise _error(name, "onesided output is supported for a forward transform of a real input only")
    n = shape[axis]
    length = n if length is None else length
    if length < 1:
        raise _error(name, f"dft_length {length} is not positive")
    w = dft_matrix(n, length, onesided, inverse, complex_input)
    dtype = str(x.ty.dtype)
    if w.size * np.dtype(dtype).itemsize > MAX_MATRIX_BYTES:
        raise _error(name, f"a transform of length {length} needs a {w.shape[0]}x{w.shape[1]} matrix, over "
                     f"{MAX_MATRIX_BYTES >> 20} MiB")
    # the transformed axis and the (real, imaginary) axis last, flattened together
    perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    moved = x if perm == list(range(rank)) else bb.emit(relax.op.permute_dims(x, perm))
    lead = [shape[d] for d in perm[:-2]]
    flat = bb.emit(relax.op.reshape(moved, [*lead, w.shape[0]]))
    y = bb.emit(relax.op.matmul(flat, relax.const(w.astype(dtype))))
    y = bb.emit(relax.op.reshape(y, [*lead, w.shape[1] // 2, 2]))
    if perm == list(range(rank)):
        return y
    return bb.emit(relax.op.permute_dims(y, [int(p) for p in np.argsort(perm)]))


# opset 17 gives the axis as an attribute (default 1), opset 20 as an input (default -2)
CONVERTERS: dict[str, type] = {
    "DFT": converter("DFT", {17: functools.partial(_convert, default_axis=1),
                             20: functools.partial(_convert, default_axis=-2)}),
}
