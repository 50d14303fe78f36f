"""Resize and Upsample as ONNX defines them, whatever the opset and attributes.

TVM's converter computes every Resize from its output size alone: its coordinate transform
divides by out / in, while ONNX's divides by the scale given, and the two differ wherever
scale * in is not whole (a 0.6x resize of 4 pixels makes 2 and maps them through 1 / 0.6, not
2): wrong numbers, silently. It also ignores `antialias` (a downsample's wider filter), resizes
only the spatial axes, and stops at `axes`, `keep_aspect_ratio_policy`, `half_pixel_symmetric`,
Resize-10's (X, scales) inputs, Upsample-9's scales input and an align_corners resize to one
pixel. ONNX's conformance cases (scripts/onnx_conformance.py) found all of these.

Here every variant is first resolved, by ONNX's rules, to an output size and a scale per axis.
Where TVM's resize kernel computes exactly that (each scale is out / in, no antialias filter,
only spatial axes), it does: a gather, as cheap as a resize gets. Otherwise each resized axis
is a constant interpolation matrix, built by ONNX's reference implementation from an identity,
and applied as a matmul along that axis: exact for every mode, coordinate transform and filter,
at O(in) multiply-adds per output instead of O(taps). Resize interpolates one axis at a time
(the reference does too), so a product of per-axis matrices is the operator itself.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm import tirx

from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import is_const
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_values
from autofuse.onnx_converters import text


def _values(expr: relax.Expr | None, what: str) -> np.ndarray | None:
    """A constant input's values (None where absent or empty); anything else is refused."""
    if expr is None:
        return None
    sizes = static_values(expr)  # sizes the frontend computed from shapes
    if sizes is not None:
        return np.array(sizes, np.int64)
    try:
        values = expr.value.numpy()
    except AttributeError:
        raise ValueError(f"Resize: {what} must be a constant (fix the model's input shapes)") from None
    return values.reshape(-1) if values.size else None


def _resolve(
    shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None, axes: list[int] | None, policy: str
) -> tuple[list[float], list[int]]:
    """(scale, output size) of every axis, as ONNX's Resize computes them."""
    rank = len(shape)
    axes = [a % rank for a in axes] if axes else list(range(rank))
    if (scales is None) == (sizes is None):
        raise ValueError("Resize: exactly one of scales and sizes must be given")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):  # type: ignore[arg-type]
        raise ValueError(f"Resize: {len(given)} scales or sizes for {len(axes)} axes")  # type: ignore[arg-type]
    scale, out = [1.0] * rank, list(shape)
    if scales is not None:
        for a, s in zip(axes, scales):
            scale[a], out[a] = float(s), int(math.floor(float(s) * shape[a]))
        return scale, out
    for a, n in zip(axes, sizes):  # type: ignore[arg-type]
        scale[a], out[a] = int(n) / shape[a], int(n)
    if policy != "stretch":
        pick = min if policy == "not_larger" else max
        common = pick(scale[a] for a in axes)
        for a in axes:
            scale[a], out[a] = common, int(common * shape[a] + 0.5)
    return scale, out


def _axis_matrix(
    n: int, out: int, scale: float, attr: dict, roi: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray]:
    """(M [out, n], b [out]) with resized = M @ x + b along one axis of length n, from ONNX's
    reference on an identity (b is the extrapolation value where tf_crop_and_resize leaves the
    input, else 0)."""
    from onnx.reference.ops import op_resize as ref

    mode = attr["mode"]
    if mode == "nearest":
        nearest = attr["nearest_mode"]
        coeffs = lambda r, s: ref._nearest_coeffs(r, mode=nearest)  # noqa: E731
    elif mode == "cubic":
        cubic = ref._cubic_coeffs_antialias if attr["antialias"] else ref._cubic_coeffs
        coeffs = lambda r, s: cubic(r, s, A=attr["cubic_coeff_a"])  # noqa: E731
    else:
        coeffs = ref._linear_coeffs_antialias if attr["antialias"] else ref._linear_coeffs

    def along(data: np.ndarray) -> np.ndarray:
        return ref._interpolate_1d_along_axis(
            data, 1, scale, out, coeffs, roi=roi, extrapolation_value=attr["extrapolation_value"],
            coordinate_transformation_mode=attr["coordinate_transformation_mode"],
            exclude_outside=attr["exclude_outside"])

    offset = along(np.zeros((1, n)))[0]
    return (along(np.eye(n)) - offset).T, offset


def _matrix_resize(
    bb: relax.BlockBuilder, x: relax.Expr, shape: tuple[int, ...], scale: list[float], out: list[int], attr: dict,
    roi: np.ndarray | None,
) -> relax.Expr:
    """Each resized axis as a matmul by its interpolation matrix (float arithmetic; an integer
    input is rounded and saturated back, as the reference's saturate_cast)."""
    dtype = str(x.ty.dtype)
    rank = len(shape)
    compute = dtype if dtype.startswith(("float", "bfloat")) else "float32"
    y = x if compute == dtype else bb.emit(relax.op.astype(x, compute))
    for a in range(rank):
        if out[a] == shape[a] and math.isclose(scale[a], 1.0) and (roi is None or (roi[a], roi[a + rank]) == (0, 1)):
            continue
        axis_roi = None if roi is None else (float(roi[a]), float(roi[a + rank]))
        m, b = _axis_matrix(shape[a], out[a], scale[a], attr, axis_roi)  # type: ignore[index]
        order = [*range(a), *range(a + 1, rank), a]
        moved = y if a == rank - 1 else bb.emit(relax.op.permute_dims(y, order))
        y = bb.emit(relax.op.matmul(moved, array_const(m.T.astype(compute))))
        if b.any():
            y = bb.emit(relax.op.add(y, array_const(b.astype(compute))))
        if a != rank - 1:
            y = bb.emit(relax.op.permute_dims(y, [*range(a), rank - 1, *range(a, rank - 1)]))
    if compute != dtype:
        info = np.iinfo(dtype)
        y = bb.emit(relax.op.clip(relax.op.round(y), int(info.min), int(info.max)))
        y = bb.emit(relax.op.astype(y, dtype))
    return y


def _tvm_exact(shape: tuple[int, ...], scale: list[float], out: list[int], attr: dict) -> bool:
    """Whether TVM's resize kernel computes this resize exactly (see the module docstring)."""
    rank = len(shape)
    if rank not in (3, 4, 5) or out[:2] != list(shape[:2]):
        return False
    # TVM maps coordinates by out / in: the same map where scale x in is out, up to rounding
    # (sizes given make scale = out / in, a float; a float32 scale of 0.6 is 0.6000000238)
    if any(abs(scale[a] * shape[a] - out[a]) > 1e-6 * out[a] for a in range(2, rank)):
        return False
    if attr["antialias"] and attr["mode"] != "nearest" and any(s < 1 for s in scale):
        return False
    align_to_one = attr["coordinate_transformation_mode"] == "align_corners" and 1 in out[2:]
    return not align_to_one and attr["coordinate_transformation_mode"] != "half_pixel_symmetric"


def _resize(
    bb: relax.BlockBuilder, x: relax.Expr, scales: np.ndarray | None, sizes: np.ndarray | None,
    roi: np.ndarray | None, attr: dict, params: list,
) -> relax.Expr:
    sizes_now = _input_sizes(x)
    axes = [int(a) for a in attr["axes"]] if attr.get("axes") else None
    # an axis sized at run time (the detections a keypoint head runs on) may only be left as it
    # is: it takes a size of 1 here, and what is computed from it never reaches a kernel
    run_time = [a for a, n in enumerate(sizes_now) if n is None]
    shape = tuple(1 if n is None else n for n in sizes_now)
    scale, out = _resolve(shape, scales, sizes, axes, attr["keep_aspect_ratio_policy"])
    rank = len(shape)
    given = {a % rank for a in axes} if axes else set(range(rank))
    if any(sizes is not None and a in given or scale[a] != 1 for a in run_time):
        raise ValueError("Resize: an axis whose size is known only at run time must keep its size (scale 1)")
    if roi is not None and axes:  # ROI given for `axes` only: spread over every axis
        full = np.array([0.0] * rank + [1.0] * rank)
        for i, a in enumerate(a % rank for a in axes):
            full[a], full[a + rank] = roi[i], roi[len(axes) + i]
        roi = full
    if attr["coordinate_transformation_mode"] != "tf_crop_and_resize":
        roi = None
    if _tvm_exact(shape, scale, out, attr) and all(a < 2 for a in run_time):  # TVM's kernel reads out[2:]
        from tvm.relax.frontend.onnx.onnx_frontend import Resize

        tvm_attr = {k: (v.encode() if isinstance(v, str) else v) for k, v in attr.items()
                    if k not in ("axes", "antialias", "keep_aspect_ratio_policy")}
        roi_const = array_const(np.asarray(roi if roi is not None else [], "float32"))
        return Resize._impl_v18(bb, [x, roi_const, None, array_const(np.asarray(out, "int64"))], tvm_attr, params)
    return _matrix_resize(bb, x, shape, scale, out, attr, roi)


def _input_sizes(x: relax.Expr) -> list[int | None]:
    """The input's sizes, None for one known only at run time."""
    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None:
        raise ValueError("Resize: the input needs a shape")
    return [int(v) if isinstance(v, tirx.IntImm) else None for v in values]


def _attributes(attr: dict, **fixed: object) -> dict:
    """Resize's attributes with ONNX's defaults (and the fixed semantics of older operators)."""
    out = {
        "mode": text(attr.get("mode", "nearest")),
        "coordinate_transformation_mode": text(attr.get("coordinate_transformation_mode", "half_pixel")),
        "nearest_mode": text(attr.get("nearest_mode", "round_prefer_floor")),
        "cubic_coeff_a": float(attr.get("cubic_coeff_a", -0.75)),
        "exclude_outside": int(attr.get("exclude_outside", 0)),
        "extrapolation_value": float(attr.get("extrapolation_value", 0.0)),
        "antialias": int(attr.get("antialias", 0)),
        "keep_aspect_ratio_policy": text(attr.get("keep_aspect_ratio_policy", "stretch")),
        "axes": list(attr.get("axes", [])),
    }
    out.update(fixed)
    if out["mode"] not in ("nearest", "linear", "cubic"):
        raise ValueError(f"Resize: unknown mode {out['mode']!r}")
    return out


def _resize_v11(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    roi, scales, sizes = (optional_input(inputs, i, params) for i in (1, 2, 3))
    if sizes is not None and not is_const(sizes) and static_values(sizes) is None:
        return _run_time_resize(bb, inputs[0], sizes, _attributes(attr))
    return _resize(bb, inputs[0], _values(scales, "scales"), _values(sizes, "sizes"), _values(roi, "roi"),
                   _attributes(attr), params)


def _run_time_resize(bb: relax.BlockBuilder, x: relax.Expr, sizes: relax.Expr, attr: dict) -> relax.Expr:
    """A 2-D resize to sizes computed at run time (Keypoint R-CNN's heatmaps, resized to each
    detection's box): TVM's kernel, sized by symbolic variables. Given sizes make ONNX's scale
    out / in, TVM's own map, so TVM computes it exactly where it computes the constant case
    exactly (see `_tvm_exact`), except that a filter's width cannot follow a downsampling
    (antialias) here and an align_corners resize to one pixel is not told apart. The batch and
    channel sizes given are checked against the input's at run time."""
    values = x.ty.shape.values if isinstance(getattr(x.ty, "shape", None), relax.ShapeExpr) else []
    mode = attr["coordinate_transformation_mode"]
    if len(values) != 4 or attr["axes"] or attr["antialias"] or attr["keep_aspect_ratio_policy"] != "stretch" \
            or mode in ("half_pixel_symmetric", "tf_crop_and_resize"):
        raise ValueError("Resize: sizes computed at run time are supported on 4-D inputs of a known shape, without "
                         f"axes, antialias, an aspect-ratio policy or the {mode} transform")
    if not isinstance(sizes.ty, relax.ShapeType):
        sizes = bb.emit(relax.op.tensor_to_shape(bb.normalize(relax.op.astype(sizes, "int64"))))
    h, w = tirx.Var("resized_h", "int64"), tirx.Var("resized_w", "int64")
    bb.match_cast(sizes, relax.ShapeType([*values[:2], h, w]))
    return relax.op.image.resize2d(
        x, size=relax.ShapeExpr([h, w]), roi=[0.0] * 4, layout="NCHW",
        method="nearest_neighbor" if attr["mode"] == "nearest" else attr["mode"],
        coordinate_transformation_mode=mode, rounding_method=attr["nearest_mode"],
        cubic_alpha=attr["cubic_coeff_a"], cubic_exclude=attr["exclude_outside"],
        extrapolation_value=attr["extrapolation_value"])


def _asymmetric_floor(
    bb: relax.BlockBuilder, x: relax.Expr, scales: np.ndarray | None, attr: dict, params: list
) -> relax.Expr:
    """Resize-10 and Upsample: out = floor(in * scale), asymmetric coordinates, nearest pixel
    rounded down (onnxruntime's reading of these older operators)."""
    if scales is None:
        raise ValueError("Resize: the scales input must be a constant")
    mode = text(attr.get("mode", "nearest"))
    fixed = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
             "mode": "linear" if mode == "bilinear" else mode}
    return _resize(bb, x, scales, None, None, _attributes({}, **fixed), params)


def _resize_v10(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    return _asymmetric_floor(bb, inputs[0], _values(optional_input(inputs, 1, params), "scales"), attr, params)


def _upsample_v7(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    return _asymmetric_floor(bb, inputs[0], np.asarray(attr.get("scales", []), "float32"), attr, params)


def _upsample_v9(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    return _asymmetric_floor(bb, inputs[0], _values(optional_input(inputs, 1, params), "scales"), attr, params)


CONVERTERS: dict[str, type] = {
    "Resize": converter("Resize", {10: _resize_v10, 11: _resize_v11}),
    "Upsample": converter("Upsample", {7: _upsample_v7, 9: _upsample_v9}),
}
