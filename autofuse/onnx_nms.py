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


def _non_max_suppression(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """The kept boxes' (batch, class, box) indices as a (kept, 3) tensor."""
    boxes, scores, most, iou, score = [*inputs, *[None] * (5 - len(inputs))]
    dims = list(scores.ty.shape.values) if isinstance(scores.ty.shape, relax.ShapeExpr) else []
    if len(dims) != 3 or not all(isinstance(d, tirx.IntImm) for d in dims[:2]):
        raise ValueError("NonMaxSuppression needs scores of a static batch and class count")
    if getattr(boxes.ty, "shape", None) is None:  # computed by ops TVM types by rank alone (in an If's branch)
        boxes = bb.match_cast(boxes, relax.TensorType([dims[0], dims[2], 4], boxes.ty.dtype))
    limit = const_int(most) if most is not None else 0  # ONNX: no limit given keeps no box
    if limit is None:
        raise ValueError(f"NonMaxSuppression's max_output_boxes_per_class is the model input "
                         f"'{getattr(most, 'name', '?')}': fix its value (--input NAME:1:int64=VALUE)")
    if limit <= 0 or (isinstance(dims[2], tirx.IntImm) and int(dims[2]) == 0):
        return relax.const(np.zeros((0, 3), "int64"))
    # no class keeps more boxes than there are (a number of boxes known at run time: the
    # candidates a detector's score filter left)
    if isinstance(dims[2], tirx.IntImm):
        limit = min(limit, int(dims[2]))
    else:
        limit = tirx.min(tirx.IntImm("int64", limit), dims[2])
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


# a single class's comparisons against one kept box run on all threads from this many candidates
PARALLEL_FROM = 4096


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

    batch, classes, count = int(scores.shape[0]), int(scores.shape[1]), scores.shape[2]
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

    def corners_ir(box, kept_b, kept_n, order, out):  # noqa: ANN001, ANN202
        """Each row's candidates in score order as (y_lo, x_lo, y_hi, x_hi, area), read once: the
        suppression compares every pair of them."""
        with IRBuilder() as ib:
            box, kept_b, kept_n, order, out = (T.buffer_proxy(b) for b in (box, kept_b, kept_n, order, out))
            with T.parallel(0, rows) as r:
                with T.serial(0, kept_n[r]) as j:
                    i = kept_b[r, order[r, j]]
                    if center:  # x, y, width, height
                        x, y, w, h = (box[r // classes, i, k] for k in range(4))
                        edges = (y - h / 2, x - w / 2, y + h / 2, x + w / 2)
                    else:
                        y1, x1, y2, x2 = (box[r // classes, i, k] for k in range(4))
                        edges = (T.min(y1, y2), T.min(x1, x2), T.max(y1, y2), T.max(x1, x2))
                    for k, v in enumerate(edges):
                        out[r, j, k] = v
                    out[r, j, 4] = (out[r, j, 2] - out[r, j, 0]) * (out[r, j, 3] - out[r, j, 1])
            return ib.get()

    edges = te.extern([(rows, count, 5)], [boxes, kept_boxes, kept, order],
                      lambda ins, outs: corners_ir(*ins, outs[0]), dtype=["float32"], name="corners", tag="corners")

    def suppress_ir(edge, kept_b, kept_n, order, thr, picked, found, alive, out, total):  # noqa: ANN001, ANN202
        with IRBuilder() as ib:
            edge, kept_b, kept_n, order, thr, picked, found, alive, out, total = (
                T.buffer_proxy(b) for b in (edge, kept_b, kept_n, order, thr, picked, found, alive, out, total))

            def drop_overlapping(r, j, k):  # noqa: ANN001, ANN202 - candidate k against kept j
                h = T.max(T.float32(0), T.min(edge[r, j, 2], edge[r, k, 2]) - T.max(edge[r, j, 0], edge[r, k, 0]))
                w = T.max(T.float32(0), T.min(edge[r, j, 3], edge[r, k, 3]) - T.max(edge[r, j, 1], edge[r, k, 1]))
                union = edge[r, j, 4] + edge[r, k, 4] - h * w
                with T.If(tvm.tirx.all(alive[r, k] == 1, edge[r, j, 4] > 0, edge[r, k, 4] > 0, h * w > 0,
                                       h * w > thr[()] * union)):
                    with T.Then():
                        alive[r, k] = T.int8(0)

            with T.seq_scope():
                # one class with many boxes (torchvision's batched_nms offsets every class into one)
                # shares each kept box's comparisons out over the threads; several classes run side by side
                with (T.serial if rows == 1 else T.parallel)(0, rows) as r:
                    n = T.buffer_proxy(T.decl_buffer([1], "int32", scope="local"))
                    n[0] = T.int32(0)
                    with T.serial(0, kept_n[r]) as j:
                        alive[r, j] = T.int8(1)
                    with T.serial(0, kept_n[r]) as j:
                        with T.If(tvm.tirx.all(alive[r, j] == 1, T.Cast("int64", n[0]) < most)):
                            with T.Then():
                                picked[r, n[0]] = kept_b[r, order[r, j]]
                                n[0] = n[0] + 1
                                if rows == 1:
                                    with T.If(kept_n[r] - j > PARALLEL_FROM):
                                        with T.Then():
                                            with T.parallel(j + 1, kept_n[r]) as k:
                                                drop_overlapping(r, j, k)
                                        with T.Else():
                                            with T.serial(j + 1, kept_n[r]) as k:
                                                drop_overlapping(r, j, k)
                                else:
                                    with T.serial(j + 1, kept_n[r]) as k:
                                        drop_overlapping(r, j, k)
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
        [(rows, most), (rows,), (rows, count), (rows * most, 3), (1,)], [edges, kept_boxes, kept, order, iou],
        lambda ins, outs: suppress_ir(*ins, *outs),
        dtype=["int32", "int32", "int8", "int64", "int64"], name="suppress", tag="suppress")
    return [indices, total]


CONVERTERS: dict[str, type] = {"NonMaxSuppression": converter("NonMaxSuppression", {10: _non_max_suppression})}
