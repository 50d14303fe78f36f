"""ONNX NonMaxSuppression: the converter and its kernel, as onnxruntime computes it.

An end-to-end detector export ends in NonMaxSuppression and gathers of the kept boxes, whose
number is known only at run time. TVM's converter typed its result as the padded buffer its
kernel fills, and its legalisation trimmed that to the kept rows afterwards, so the ops reading
it lost their shapes (a YOLOv8 head's gathers failed to legalise: "emit_te now only supports
Tensor that has ShapeExpr shape"). Here the kernel is emitted at import, its padded rows trimmed
in Relax to a (kept, 3) tensor from the start: every op after it is typed with `kept`
(tvm_bridge then keeps such kernels out of fused groups).

TVM's kernel (topi.vision.all_class_non_max_suppression) also argsorted every class's scores in
full before it found the threshold (a YOLOv8n at 320, 18 classes x 2100 anchors: 2.4 of its 16
ms, with no score above it), ran the classes one after another, suppressed at an IoU equal to
the threshold and never a box scored at or below zero; its converter took an IoU threshold of
0.5 and a score threshold of 0 where ONNX's defaults are 0 and none, took those defaults too for
thresholds that are model inputs, 0 boxes for a box limit that is one, and overflowed int32 on
INT64_MAX (torchvision's export). `_kernel` keeps onnxruntime's rules. CPU only: it calls TVM's
sort, which has no GPU version (nor has TVM 0.27 a GPU kernel for the suppression).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm import tirx

from autofuse.onnx_converters import const_int
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import static_shape


def _non_max_suppression(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """The kept boxes' (batch, class, box) indices as a (kept, 3) tensor."""
    boxes, scores, most, iou, score = [*inputs, *[None] * (5 - len(inputs))]
    shape = static_shape(scores)
    if static_shape(boxes) is None or shape is None:
        raise ValueError("NonMaxSuppression needs boxes and scores of static shapes")
    limit = const_int(most) if most is not None else 0  # ONNX: no limit given keeps no box
    if limit is None:
        raise ValueError(f"NonMaxSuppression's max_output_boxes_per_class is the model input "
                         f"'{getattr(most, 'name', '?')}': fix its value (--input NAME:1:int64=VALUE)")
    limit = min(max(limit, 0), shape[-1])  # no class keeps more boxes than there are
    if limit == 0:
        return relax.const(np.zeros((0, 3), "int64"))
    # thresholds as scalars, constants or read when the model runs; ONNX's defaults
    iou = relax.const(0.0, "float32") if iou is None else bb.emit(relax.op.reshape(iou, []))
    score = relax.const(float("-inf"), "float32") if score is None else bb.emit(relax.op.reshape(score, []))
    nms = bb.emit(bb.call_te(_kernel, boxes, scores, limit, iou, score, int(attr.get("center_point_box", 0)),
                             primfunc_name_hint="non_max_suppression"))
    count = bb.emit(relax.op.tensor_to_shape(bb.emit(relax.TupleGetItem(nms, 1))))
    kept = tirx.Var("kept", "int64")
    bb.match_cast(count, relax.ShapeType([kept]))
    rows = bb.emit(relax.op.arange(0, kept, dtype="int64"))
    return relax.op.take(bb.emit(relax.TupleGetItem(nms, 0)), rows, axis=0)


def _kernel(boxes: object, scores: object, most: int, iou: object, score: object, center: int) -> list:
    """(padded selected rows (batch x classes x most, 3), their count (1,)), rows by batch,
    class, then score, as ONNX orders them.

    Each class's scores above the threshold are copied out in box order and only those sorted
    (stable: ties keep box order); the classes then run in parallel, each keeping its best box
    left and dropping the boxes it overlaps by more than the IoU threshold, as onnxruntime does
    (corners in either order, or centre and size; an empty box overlaps nothing)."""
    from tvm import te
    from tvm import topi
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    batch, classes, count = (int(d) for d in scores.shape)
    rows = batch * classes
    flat = topi.reshape(scores, (rows, count))

    def above_ir(src, thr, out_s, out_b, out_n):  # noqa: ANN001, ANN202
        with IRBuilder() as ib:
            src, thr, out_s, out_b, out_n = (T.buffer_proxy(b) for b in (src, thr, out_s, out_b, out_n))
            with T.parallel(0, rows) as r:
                n = T.buffer_proxy(T.decl_buffer([1], "int32", scope="local"))
                n[0] = T.int32(0)
                with T.serial(0, count) as i:
                    with T.If(src[r, i] > thr[()]):
                        with T.Then():
                            out_s[r, n[0]] = src[r, i]
                            out_b[r, n[0]] = T.Cast("int32", i)
                            n[0] = n[0] + 1
                out_n[r] = n[0]
            return ib.get()

    kept_scores, kept_boxes, kept = te.extern(
        [(rows, count), (rows, count), (rows,)], [flat, score],
        lambda ins, outs: above_ir(ins[0], ins[1], outs[0], outs[1], outs[2]),
        dtype=[scores.dtype, "int32", "int32"], name="above_threshold", tag="above_threshold")
    # the first kept[r] of each row, by score descending; the rest are never read
    order = topi.argsort(kept_scores, valid_count=kept, axis=1, is_ascend=False, dtype="int32")

    def suppress_ir(box, kept_b, kept_n, order, thr, picked, found, alive, out, total):  # noqa: ANN001, ANN202
        with IRBuilder() as ib:
            box, kept_b, kept_n, order, thr, picked, found, alive, out, total = (
                T.buffer_proxy(b) for b in (box, kept_b, kept_n, order, thr, picked, found, alive, out, total))

            def corners(b, i):  # noqa: ANN001, ANN202 - (y_lo, x_lo, y_hi, x_hi)
                if center:  # x, y, width, height
                    x, y, w, h = (box[b, i, k] for k in range(4))
                    return y - h / 2, x - w / 2, y + h / 2, x + w / 2
                y1, x1, y2, x2 = (box[b, i, k] for k in range(4))
                return T.min(y1, y2), T.min(x1, x2), T.max(y1, y2), T.max(x1, x2)

            with T.seq_scope():
                with T.parallel(0, rows) as r:
                    b = r // classes
                    n = T.buffer_proxy(T.decl_buffer([1], "int32", scope="local"))
                    n[0] = T.int32(0)
                    with T.serial(0, kept_n[r]) as j:
                        alive[r, j] = T.int8(1)
                    with T.serial(0, kept_n[r]) as j:
                        with T.If(tvm.tirx.all(alive[r, j] == 1, n[0] < most)):
                            with T.Then():
                                a = kept_b[r, order[r, j]]
                                picked[r, n[0]] = a
                                n[0] = n[0] + 1
                                ay0, ax0, ay1, ax1 = corners(b, a)
                                area_a = (ay1 - ay0) * (ax1 - ax0)
                                with T.serial(j + 1, kept_n[r]) as k:
                                    with T.If(alive[r, k] == 1):
                                        with T.Then():
                                            by0, bx0, by1, bx1 = corners(b, kept_b[r, order[r, k]])
                                            area_b = (by1 - by0) * (bx1 - bx0)
                                            h = T.max(T.float32(0), T.min(ay1, by1) - T.max(ay0, by0))
                                            w = T.max(T.float32(0), T.min(ax1, bx1) - T.max(ax0, bx0))
                                            union = area_a + area_b - h * w
                                            with T.If(tvm.tirx.all(area_a > 0, area_b > 0, h * w > 0,
                                                                   h * w > thr[()] * union)):
                                                with T.Then():
                                                    alive[r, k] = T.int8(0)
                    found[r] = n[0]
                total[0] = T.int64(0)  # rows written so far, then their count
                with T.serial(0, rows) as r:
                    with T.serial(0, found[r]) as t:
                        out[total[0] + t, 0] = T.Cast("int64", r // classes)
                        out[total[0] + t, 1] = T.Cast("int64", r % classes)
                        out[total[0] + t, 2] = T.Cast("int64", picked[r, t])
                    total[0] = total[0] + T.Cast("int64", found[r])
            return ib.get()

    _, _, _, indices, total = te.extern(
        [(rows, most), (rows,), (rows, count), (rows * most, 3), (1,)], [boxes, kept_boxes, kept, order, iou],
        lambda ins, outs: suppress_ir(*ins, *outs),
        dtype=["int32", "int32", "int8", "int64", "int64"], name="suppress", tag="suppress")
    return [indices, total]


CONVERTERS: dict[str, type] = {"NonMaxSuppression": converter("NonMaxSuppression", {10: _non_max_suppression})}
