"""ONNX's Fourier operators (DFT, STFT, and the Hann/Hamming/Blackman windows) as matmuls by constants.

TVM's Relax ONNX frontend has no DFT converter, so a model with a Fourier transform (FNet's token
mixing, a spectrogram front end) would not import. With shapes fixed, the length N along the
transformed axis is known and the transform is a linear map: each output frequency k is
sum_t x[t] * exp(-+2*pi*i*t*k/L). Written over interleaved (real, imaginary) pairs it is one
real matmul by a constant (2N x 2M) matrix (N x 2M for real input; 2N x L for an inverse of a
one-sided spectrum, numpy's irfft, a vocoder's last step), which the kernels schedule
like any projection with constant weights; no complex type, no new kernel. O(N^2) work against
an FFT's O(N log N), which pays at the lengths models transform along a hidden or token axis
(hundreds); a matrix over MAX_MATRIX_BYTES is refused with a one-line error instead. STFT
(what torch.stft exports as, a spectrogram front end) is the same matmul over the signal's
frames, gathered by constant indices, with a constant window folded into the matrix's rows; the
window operators of a fixed size are constants.
"""

from __future__ import annotations

import functools

import numpy as np
from tvm import relax

from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import const_int
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


def irfft_matrix(n: int, length: int) -> np.ndarray:
    """The real matrix W with [X_re, X_im interleaved over n one-sided bins] @ W = x (`length`
    real samples), numpy's irfft: bins past length // 2 dropped, missing ones zero, each bin
    between the first and the Nyquist one counted twice (its mirror), their imaginary parts
    (and those of the first and Nyquist bins) as the Hermitian spectrum implies."""
    k = np.arange(min(n, length // 2 + 1), dtype=np.int64)[:, None]
    t = np.arange(length, dtype=np.int64)[None, :]
    angle = 2 * np.pi * ((t * k) % length) / length
    twice = np.where((k == 0) | (2 * k == length), 1.0, 2.0) / length
    w = np.zeros((n, 2, length))
    w[: len(k), 0], w[: len(k), 1] = twice * np.cos(angle), -twice * np.sin(angle)
    return w.reshape(2 * n, length)


def _error(name: str, problem: str, op: str = "DFT") -> ValueError:
    return ValueError(f"{op} node {name!r}: {problem}")


def _scalar(expr: relax.Expr | None, name: str, what: str, op: str = "DFT") -> int | None:
    if expr is None:
        return None
    value = const_int(expr)
    if value is None:
        raise _error(name, f"{what} is not a constant", op)
    return value


def _check_size(rows: int, columns: int, dtype: str, name: str, length: int, op: str) -> None:
    """Before the matrix is built: a too long transform's float64 matrix took 48 s and 6 GB to
    be refused."""
    if rows * columns * np.dtype(dtype).itemsize > MAX_MATRIX_BYTES:
        raise _error(name, f"a transform of length {length} needs a {rows}x{columns} matrix, over "
                     f"{MAX_MATRIX_BYTES >> 20} MiB", op)


def _dft_shape(n: int, length: int, onesided: bool, complex_input: bool) -> tuple[int, int]:
    """dft_matrix's shape."""
    return n * (2 if complex_input else 1), 2 * (length // 2 + 1 if onesided else length)


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
    if onesided and inverse != complex_input:
        raise _error(name, "onesided is a forward transform of a real input or an inverse one of a complex input")
    n = shape[axis]
    length = (2 * (n - 1) if onesided and inverse else n) if length is None else length
    if length < 1:
        raise _error(name, f"dft_length {length} is not positive")
    dtype = str(x.ty.dtype)
    # an inverse one-sided transform (irfft) gives `length` real samples, a last axis of 1
    irfft = onesided and inverse
    _check_size(*((2 * n, length) if irfft else _dft_shape(n, length, onesided, complex_input)), dtype, name, length,
                "DFT")
    matrix = irfft_matrix(n, length) if irfft else dft_matrix(n, length, onesided, inverse, complex_input)
    w = matrix.astype(dtype)
    width = 1 if irfft else 2
    # the transformed axis and the (real, imaginary) axis last, flattened together
    perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    moved = x if perm == list(range(rank)) else bb.emit(relax.op.permute_dims(x, perm))
    lead = [shape[d] for d in perm[:-2]]
    flat = bb.emit(relax.op.reshape(moved, [*lead, w.shape[0]]))
    y = bb.emit(relax.op.matmul(flat, array_const(w)))
    y = bb.emit(relax.op.reshape(y, [*lead, w.shape[1] // width, width]))
    if perm == list(range(rank)):
        return y
    return bb.emit(relax.op.permute_dims(y, [int(p) for p in np.argsort(perm)]))


def _stft(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """[batch, frames, bins, 2]: frame f is signal[f * step : f * step + frame_length], windowed,
    transformed; the frames gathered by a constant index, the window folded into the matrix."""
    name = str(attr["tvm_custom"]["name"] or "<unnamed>")
    x = inputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) != 3 or shape[-1] not in (1, 2):
        raise _error(name, "the signal needs a static shape [batch, length, 1 or 2]", "STFT")
    step = _scalar(optional_input(inputs, 1, params), name, "frame_step", "STFT")
    window = optional_input(inputs, 2, params)
    length = _scalar(optional_input(inputs, 3, params), name, "frame_length", "STFT")
    window_shape = None if window is None else static_shape(window)
    if window is not None and window_shape is None:
        raise _error(name, "the window needs a static shape", "STFT")
    if length is None:
        if window_shape is None:
            raise _error(name, "neither a window nor frame_length gives the frame length", "STFT")
        length = window_shape[0]
    if step is None or step < 1 or not 1 <= length <= shape[1]:
        raise _error(name, f"frame_step {step} and frame_length {length} do not frame {shape[1]} samples", "STFT")
    onesided, complex_input = bool(int(attr.get("onesided", 1))), shape[-1] == 2
    if onesided and complex_input:
        raise _error(name, "onesided output is supported for a real signal only", "STFT")
    dtype = str(x.ty.dtype)
    _check_size(*_dft_shape(length, length, onesided, complex_input), dtype, name, length, "STFT")
    w = dft_matrix(length, length, onesided, inverse=False, complex_input=complex_input)
    if window is not None and is_const(window):  # row t (both of its parts) times window[t]
        w = w * np.repeat(window.value.numpy().astype(np.float64), shape[-1])[:, None]
    w = w.astype(dtype)
    frames = (shape[1] - length) // step + 1
    index = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    framed = bb.emit(relax.op.take(x, array_const(index.astype("int64")), axis=1))  # [b, frames, length, c]
    if window is not None and not is_const(window):
        framed = bb.emit(relax.op.multiply(framed, relax.op.reshape(window, [length, 1])))
    flat = bb.emit(relax.op.reshape(framed, [shape[0], frames, w.shape[0]]))
    y = bb.emit(relax.op.matmul(flat, array_const(w)))
    return bb.emit(relax.op.reshape(y, [shape[0], frames, w.shape[1] // 2, 2]))


def window(n: int, kind: str, periodic: bool) -> np.ndarray:
    """ONNX's window functions of size n (periodic: the period is n, else n - 1)."""
    period = n if periodic else n - 1
    phase = 2 * np.pi * np.arange(n) / max(period, 1)
    if kind == "HannWindow":
        return 0.5 - 0.5 * np.cos(phase)
    if kind == "HammingWindow":
        return 25 / 46 - (1 - 25 / 46) * np.cos(phase)
    return 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2 * phase)  # BlackmanWindow


def _window_converter(kind: str) -> type:
    def convert(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
        from onnx.helper import tensor_dtype_to_np_dtype

        name = str(attr["tvm_custom"]["name"] or "<unnamed>")
        size = _scalar(optional_input(inputs, 0, params), name, "size", kind)
        if size is None or size < 1:
            raise _error(name, f"size {size} is not a positive constant", kind)
        dtype = tensor_dtype_to_np_dtype(int(attr.get("output_datatype", 1)))
        return array_const(window(size, kind, bool(int(attr.get("periodic", 1)))).astype(dtype))

    return converter(kind, {17: convert})


# opset 17 gives the axis as an attribute (default 1), opset 20 as an input (default -2)
CONVERTERS: dict[str, type] = {
    "DFT": converter("DFT", {17: functools.partial(_convert, default_axis=1),
                             20: functools.partial(_convert, default_axis=-2)}),
    "STFT": converter("STFT", {17: _stft}),
    **{kind: _window_converter(kind) for kind in ("HannWindow", "HammingWindow", "BlackmanWindow")},
}
