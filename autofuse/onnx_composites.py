"""ONNX operators TVM's frontend lacks that are compositions of Relax ops it has.

Celu, Swish and SwiGLU (activations), LpNormalization, CumProd, ReverseSequence, ConvInteger,
CenterCropPad, Col2Im (a transposed convolution) and RotaryEmbedding (opset 23; onnxscript's
`onnx_fusions` writes Llama-style models' RoPE as it); and InstanceNormalization over groups of
channels, PyTorch's export of GroupNorm, as the group norm it computes.
Each becomes the elementwise, reduction and indexing ops it computes, as the ONNX reference
defines it, so the fusion search sees them like any other chain of ops (an activation fuses into
its producer's epilogue). Before these, a model holding one stopped at "unsupported operator".
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import calls_op
from autofuse.onnx_converters import const_like
from autofuse.onnx_converters import const_int
from autofuse.onnx_converters import const_ints
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_shape
from autofuse.onnx_converters import stock


def swish(bb: relax.BlockBuilder, x: relax.Expr, alpha: float) -> relax.Expr:
    """x * sigmoid(alpha x)."""
    gate = x if alpha == 1.0 else bb.emit(relax.op.multiply(x, const_like(alpha, x)))
    return bb.emit(relax.op.multiply(x, relax.op.sigmoid(gate)))


def _celu(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    x, alpha = inputs[0], float(attr.get("alpha", 1.0))
    below = relax.op.subtract(relax.op.exp(relax.op.divide(x, const_like(alpha, x))), const_like(1.0, x))
    neg = relax.op.multiply(below, const_like(alpha, x))
    return bb.emit(relax.op.add(relax.op.maximum(x, const_like(0.0, x)), relax.op.minimum(neg, const_like(0.0, x))))


def _swish_op(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    return swish(bb, inputs[0], float(attr.get("alpha", 1.0)))


def _swiglu(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    return bb.emit(relax.op.multiply(swish(bb, inputs[0], float(attr.get("alpha", 1.0))), inputs[1]))


def _lp_normalization(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """x / ||x||_p along `axis` (p 1 or 2); a zero norm gives zeros (x is zero there: x / 1)."""
    x, axis, p = inputs[0], int(attr.get("axis", -1)), int(attr.get("p", 2))
    if p not in (1, 2):
        raise ValueError(f"LpNormalization: p must be 1 or 2, not {p}")
    if p == 1:
        norm = bb.emit(relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True))
    else:
        norm = bb.emit(relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True)))
    safe = relax.op.where(relax.op.equal(norm, const_like(0.0, norm)), const_like(1.0, norm), norm)
    return bb.emit(relax.op.divide(x, safe))


def _cumprod(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    x = inputs[0]
    axis = const_int(optional_input(inputs, 1, params))
    if axis is None:
        raise ValueError("CumProd: the axis must be a constant")
    if int(attr.get("reverse", 0)):
        x = bb.emit(relax.op.flip(x, axis))
    y = bb.emit(relax.op.cumprod(x, axis=axis, exclusive=bool(int(attr.get("exclusive", 0)))))
    return bb.emit(relax.op.flip(y, axis)) if int(attr.get("reverse", 0)) else y


def _reverse_sequence(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """out[t, b] = x[len[b] - 1 - t, b] for t < len[b], else x[t, b]: a gather along the time
    axis with indices computed from the (runtime) lengths."""
    x, lens = inputs[0], inputs[1]
    shape = static_shape(x)
    if shape is None:
        raise ValueError("ReverseSequence: the input needs a static shape")
    time_axis, batch_axis = int(attr.get("time_axis", 0)), int(attr.get("batch_axis", 1))
    steps = shape[time_axis]
    # [time, 1] against [1, batch], then laid out along the input's two axes
    t = array_const(np.arange(steps, dtype="int64").reshape(steps, 1))
    n = bb.emit(relax.op.reshape(relax.op.astype(lens, "int64"), [1, shape[batch_axis]]))
    index = relax.op.where(relax.op.less(t, n), relax.op.subtract(relax.op.subtract(n, relax.const(1, "int64")), t), t)
    if time_axis > batch_axis:
        index = relax.op.permute_dims(index, [1, 0])
    layout = [shape[i] if i in (time_axis, batch_axis) else 1 for i in range(len(shape))]
    index = bb.emit(relax.op.reshape(index, layout))
    index = bb.emit(relax.op.broadcast_to(index, shape))
    return bb.emit(relax.op.gather_elements(x, index, axis=time_axis))


def _conv_integer(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """(x - x_zero_point) conv (w - w_zero_point) in int32 (onnxruntime's quantize_dynamic writes
    convolutions so): the stock Conv converter on the shifted operands, so that padding, which
    stands for a real zero, adds zero."""
    from tvm.relax.frontend.onnx.onnx_frontend import Conv

    x, w = inputs[0], inputs[1]
    x_zp, w_zp = optional_input(inputs, 2, params), optional_input(inputs, 3, params)
    x = bb.emit(relax.op.astype(x, "int32"))
    w = bb.emit(relax.op.astype(w, "int32"))
    if x_zp is not None:
        x = bb.emit(relax.op.subtract(x, relax.op.astype(x_zp, "int32")))
    if w_zp is not None:
        zp = bb.emit(relax.op.astype(w_zp, "int32"))
        if static_shape(w_zp) not in ((), (1,)):  # one per output channel
            zp = relax.op.reshape(zp, [-1] + [1] * (len(static_shape(w)) - 1))
        w = bb.emit(relax.op.subtract(w, zp))
    return Conv._impl_v11(bb, [x, w, None], attr, params)


def rotary_embedding(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """RoPE as the ONNX reference computes it: [b, s, heads, head] rows rotated pairwise (the
    two halves, or even/odd elements when interleaved) by the cached cos/sin of their position."""
    x, cos, sin = inputs[0], inputs[1], inputs[2]
    positions = optional_input(inputs, 3, params)
    shape = static_shape(x)
    if shape is None or len(shape) not in (3, 4):
        raise ValueError("RotaryEmbedding: the input needs a static 3-D or 4-D shape")
    if len(shape) == 4:  # [b, heads, s, head] -> [b, s, heads, head]
        b, heads, s, head = shape
        x = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))
    else:
        heads = int(attr.get("num_heads", 0))
        if not heads:
            raise ValueError("RotaryEmbedding: a 3-D input needs the num_heads attribute")
        b, s, hidden = shape
        head = hidden // heads
        x = bb.emit(relax.op.reshape(x, [b, s, heads, head]))
    dim = int(attr.get("rotary_embedding_dim", 0)) or head
    half = dim // 2
    if positions is not None:  # [max_pos, half] caches indexed by [b, s] positions
        cos, sin = (bb.emit(relax.op.take(c, positions, axis=0)) for c in (cos, sin))
    cos, sin = (bb.emit(relax.op.reshape(c, [b, s, 1, half])) for c in (cos, sin))
    rotate = x if dim == head else bb.emit(relax.op.strided_slice(x, [3], [0], [dim]))
    if int(attr.get("interleaved", 0)):
        pairs = bb.emit(relax.op.reshape(rotate, [b, s, heads, half, 2]))
        x1, x2 = (bb.emit(relax.op.squeeze(relax.op.strided_slice(pairs, [4], [i], [i + 1]), [4])) for i in (0, 1))
    else:
        x1, x2 = (bb.emit(relax.op.strided_slice(rotate, [3], [i * half], [(i + 1) * half])) for i in (0, 1))
    real = relax.op.subtract(relax.op.multiply(cos, x1), relax.op.multiply(sin, x2))
    imag = relax.op.add(relax.op.multiply(sin, x1), relax.op.multiply(cos, x2))
    if int(attr.get("interleaved", 0)):
        rotated = bb.emit(relax.op.reshape(relax.op.stack([real, imag], axis=4), [b, s, heads, dim]))
    else:
        rotated = bb.emit(relax.op.concat([real, imag], axis=3))
    if dim != head:
        rotated = bb.emit(relax.op.concat([rotated, relax.op.strided_slice(x, [3], [dim], [head])], axis=3))
    if len(shape) == 4:
        return bb.emit(relax.op.permute_dims(rotated, [0, 2, 1, 3]))
    return bb.emit(relax.op.reshape(rotated, shape))


def _center_crop_pad(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """Each of `axes` cropped or zero-padded to its target length around the centre (an odd
    difference leaves the extra element at the end): a strided slice, then a pad."""
    x, sizes = inputs[0], const_ints(optional_input(inputs, 1, params))
    shape = static_shape(x)
    if shape is None or sizes is None:
        raise ValueError("CenterCropPad: the input needs a static shape and the target shape must be a constant")
    axes = [int(a) % len(shape) for a in attr.get("axes", range(len(shape)))]
    begin, end, pad = [0] * len(shape), list(shape), [0] * (2 * len(shape))
    for axis, size in zip(axes, sizes):
        if size < shape[axis]:
            begin[axis] = (shape[axis] - size) // 2
            end[axis] = begin[axis] + size
        elif size > shape[axis]:
            pad[2 * axis] = (size - shape[axis]) // 2
            pad[2 * axis + 1] = size - shape[axis] - pad[2 * axis]
    if begin != [0] * len(shape) or end != list(shape):
        x = bb.emit(relax.op.strided_slice(x, list(range(len(shape))), begin, end))
    return bb.emit(relax.op.nn.pad(x, pad)) if any(pad) else x


def _col2im(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """[N, C * prod(block), L] blocks summed back into [N, C, *image] (PyTorch's fold): a
    transposed convolution of the blocks' grid, grouped by channel, with one-hot kernels (block
    element k of channel c lands at kernel position k), so TVM's convolution schedules run it."""
    x = inputs[0]
    image, block = (const_ints(optional_input(inputs, i, params)) for i in (1, 2))
    shape = static_shape(x)
    if shape is None or image is None or block is None:
        raise ValueError("Col2Im: the input needs a static shape, image_shape and block_shape must be constants")
    dims = len(image)
    if dims not in (1, 2):
        raise ValueError(f"Col2Im: {dims}-D images are not supported (1-D and 2-D are)")
    strides = [int(v) for v in attr.get("strides", [1] * dims)]
    dilations = [int(v) for v in attr.get("dilations", [1] * dims)]
    pads = [int(v) for v in attr.get("pads", [0] * 2 * dims)]
    # the span the blocks' first elements may start over: a grid of span // stride + 1 blocks,
    # and span % stride last rows no block reaches (the transposed convolution's output padding)
    span = [image[i] + pads[i] + pads[i + dims] - dilations[i] * (block[i] - 1) - 1 for i in range(dims)]
    grid = [span[i] // strides[i] + 1 for i in range(dims)]
    n, rows, length = shape
    k = int(np.prod(block))
    channels = rows // k
    if rows % k or length != int(np.prod(grid)):
        raise ValueError(f"Col2Im: input {list(shape)} does not hold {block} blocks over a {grid} grid")
    kernel = np.eye(k, dtype=str(x.ty.dtype)).reshape(k, 1, *block)
    weight = array_const(np.tile(kernel, (channels, 1) + (1,) * dims))  # [C * K, 1, *block]
    extra = [span[i] % strides[i] for i in range(dims)]
    grid_x = bb.emit(relax.op.reshape(x, [n, rows, *grid]))
    transpose = relax.op.nn.conv2d_transpose if dims == 2 else relax.op.nn.conv1d_transpose
    return bb.emit(transpose(grid_x, weight, strides=strides, padding=pads, output_padding=extra,
                             dilation=dilations, groups=channels))


def _instance_norm(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """InstanceNormalization of x [N, C, *spatial] reshaped to [N, G, -1] (how PyTorch exports
    GroupNorm: reshape, instance norm, reshape back, per-channel affine) as the group norm of x,
    reshaped as the node's output is: the reshape back then cancels (`_LayoutRewriter`), and
    the group norm goes channels-last with the convolutions around it. Normalised over the
    reshape, the image between NHWC convolutions was transposed to NCHW and back at every
    GroupNorm (a VAE decoder's 64 x 256 x 256 ones: 15.6 ms each, 4.4 as a group norm). Any
    other instance norm is the stock converter's."""
    data, scale, bias = inputs[0], inputs[1], inputs[2]
    src = bb.lookup_binding(data) if isinstance(data, relax.Var) else data
    shape, x = static_shape(data), src.args[0] if calls_op(src, "relax.reshape") else None
    whole = static_shape(x) if x is not None else None
    if not (shape and whole and len(shape) == 3 and len(whole) >= 3 and whole[0] == shape[0]
            and whole[1] % shape[1] == 0 and int(np.prod(whole[1:])) == shape[1] * shape[2]):
        return stock("InstanceNormalization")._impl_v6(bb, inputs, attr, params)
    groups, channels = shape[1], whole[1]

    def per_channel(v: relax.Expr) -> relax.Expr:
        return bb.emit(relax.op.reshape(relax.op.broadcast_to(relax.op.reshape(v, [groups, 1]),
                                                              [groups, channels // groups]), [channels]))

    norm = relax.op.nn.group_norm(x, per_channel(scale), per_channel(bias), groups, channel_axis=1,
                                  axes=list(range(2, len(whole))), epsilon=float(attr.get("epsilon", 1e-5)))
    return bb.emit(relax.op.reshape(bb.emit(norm), shape))


CONVERTERS: dict[str, type] = {
    "InstanceNormalization": converter("InstanceNormalization", {6: _instance_norm}),
    "Celu": converter("Celu", {1: _celu}),
    "Swish": converter("Swish", {1: _swish_op}),
    "SwiGLU": converter("SwiGLU", {1: _swiglu}),
    "LpNormalization": converter("LpNormalization", {1: _lp_normalization}),
    "CumProd": converter("CumProd", {1: _cumprod}),
    "ReverseSequence": converter("ReverseSequence", {1: _reverse_sequence}),
    "RotaryEmbedding": converter("RotaryEmbedding", {1: rotary_embedding}),
    "ConvInteger": converter("ConvInteger", {1: _conv_integer}),
    "CenterCropPad": converter("CenterCropPad", {18: _center_crop_pad}),
    "Col2Im": converter("Col2Im", {18: _col2im}),
}
