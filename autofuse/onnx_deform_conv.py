"""ONNX DeformConv (opset 19; torchvision's deform_conv2d exports as it), composed from Relax ops.

Detection and segmentation models (DCNv1/v2 heads, deformable backbones) sample each kernel tap
at a learned offset from its grid position. TVM's frontend has no converter. Here it is what the
ONNX reference computes: every tap's input value bilinearly interpolated at (row, column) +
offset, corners outside the image read as zero (GridSample with zero padding, align_corners), times
the optional mask; the sampled columns [N, C * taps, out pixels] are then a grouped matmul with
the weights, as an im2col convolution is. Sampling is four gathers (one per corner) of the
flattened image, so the fusion search sees gathers, elementwise weights and a matmul.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import const_like
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_shape


def _deform_conv(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    x, w, offset = inputs[0], inputs[1], inputs[2]
    bias, mask = optional_input(inputs, 3, params), optional_input(inputs, 4, params)
    xs, ws, os_ = static_shape(x), static_shape(w), static_shape(offset)
    if xs is None or ws is None or os_ is None or len(xs) != 4:
        raise ValueError("DeformConv: only 2-D images of static shape are supported")
    n, c, h, width = xs
    out_c, _, kh, kw = ws
    oh, ow = os_[2:]
    group, offset_group = int(attr.get("group", 1)), int(attr.get("offset_group", 1))
    sh, sw = (int(v) for v in attr.get("strides", [1, 1]))
    dh, dw = (int(v) for v in attr.get("dilations", [1, 1]))
    top, left = (int(v) for v in attr.get("pads", [0, 0, 0, 0])[:2])
    taps, pixels, dtype = kh * kw, oh * ow, str(x.ty.dtype)
    # grid positions of every tap at every output pixel: [1, 1, taps, oh, ow]
    rows = (np.arange(kh) * dh)[:, None, None, None] + (np.arange(oh) * sh - top)[None, None, :, None]
    cols = (np.arange(kw) * dw)[None, :, None, None] + (np.arange(ow) * sw - left)[None, None, None, :]
    grid_y = array_const(np.broadcast_to(rows, (kh, kw, oh, ow)).reshape(1, 1, taps, oh, ow).astype(dtype))
    grid_x = array_const(np.broadcast_to(cols, (kh, kw, oh, ow)).reshape(1, 1, taps, oh, ow).astype(dtype))
    shift = bb.emit(relax.op.reshape(offset, [n, offset_group, taps, 2, oh, ow]))
    y = bb.emit(relax.op.add(grid_y, relax.op.squeeze(relax.op.strided_slice(shift, [3], [0], [1]), [3])))
    x_pos = bb.emit(relax.op.add(grid_x, relax.op.squeeze(relax.op.strided_slice(shift, [3], [1], [2]), [3])))
    y0, x0 = bb.emit(relax.op.floor(y)), bb.emit(relax.op.floor(x_pos))
    fy, fx = bb.emit(relax.op.subtract(y, y0)), bb.emit(relax.op.subtract(x_pos, x0))
    scale = None if mask is None else bb.emit(relax.op.reshape(mask, [n, offset_group, taps, oh, ow]))
    image = bb.emit(relax.op.reshape(x, [n, offset_group, c // offset_group, h * width]))
    flat = [n, offset_group, 1, taps * pixels]
    sampled = None
    for dy in (0, 1):
        for dx in (0, 1):
            yy, xx = bb.emit(relax.op.add(y0, const_like(dy, y0))), bb.emit(relax.op.add(x0, const_like(dx, x0)))
            weight = relax.op.multiply(fy if dy else relax.op.subtract(const_like(1.0, fy), fy),
                                       fx if dx else relax.op.subtract(const_like(1.0, fx), fx))
            inside = relax.op.logical_and(_within(yy, h - 1), _within(xx, width - 1))
            weight = relax.op.where(inside, weight, const_like(0.0, y0))
            if scale is not None:
                weight = relax.op.multiply(weight, scale)
            weight = bb.emit(relax.op.reshape(weight, flat))
            row = relax.op.clip(relax.op.astype(yy, "int64"), 0, h - 1)
            col = relax.op.clip(relax.op.astype(xx, "int64"), 0, width - 1)
            index = relax.op.add(relax.op.multiply(row, relax.const(width, "int64")), col)
            index = bb.emit(relax.op.broadcast_to(relax.op.reshape(index, flat),
                                                  [n, offset_group, c // offset_group, taps * pixels]))
            term = relax.op.multiply(relax.op.gather_elements(image, index, axis=3), weight)
            sampled = bb.emit(term if sampled is None else relax.op.add(sampled, term))
    # [n, group, c / group * taps, pixels] against the weights [group, out_c / group, c / group * taps]
    columns = bb.emit(relax.op.reshape(sampled, [n, group, c // group * taps, pixels]))
    weights = bb.emit(relax.op.reshape(w, [1, group, out_c // group, c // group * taps]))
    out = bb.emit(relax.op.reshape(relax.op.matmul(weights, columns), [n, out_c, oh, ow]))
    if bias is not None:
        out = bb.emit(relax.op.add(out, relax.op.reshape(bias, [1, out_c, 1, 1])))
    return out


def _within(v: relax.Expr, last: int) -> relax.Expr:
    """0 <= v <= last, elementwise (a corner's row or column inside the image)."""
    return relax.op.logical_and(relax.op.greater_equal(v, const_like(0.0, v)), relax.op.less_equal(v, const_like(last, v)))


CONVERTERS: dict[str, type] = {"DeformConv": converter("DeformConv", {19: _deform_conv})}
