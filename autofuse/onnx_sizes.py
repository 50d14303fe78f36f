"""Shape arithmetic on sizes known only at run time: a detector's post-processing, imported.

torchvision's detection exports (SSD, Faster R-CNN, RetinaNet, FCOS) filter each class's scores
with NonZero, keep the best min(k, kept) of them with TopK, and branch on whether any box is left
(If numel == 0). TVM's frontend types a shape as a ShapeExpr and refuses one as the input of any
op outside a short list ("Node /m/ReduceMin cannot handle ShapeExpr inputs"); its TopK takes k
only as a constant. Here:
- `shapes_as_tensors` puts a marker Cast between a tensor that may be a shape and each op outside
  that list; the marker's converter (`shape_tensor`) makes a shape a tensor (shape_to_tensor),
  which every op takes, and passes anything else through;
- onnx_corrections.shape_values reads reductions of such tensors (ReduceMin of [k, n]) as the
  expression of sizes they are (min(k, n));
- TopK with such a k sorts the whole axis and keeps its first k (a slice by a run-time size).
"""

from __future__ import annotations

import numpy as np
import onnx
import tvm
import tvm_ffi
from onnx import helper
from tvm import relax
from tvm import tirx

from autofuse.onnx_converters import const_int
from autofuse.onnx_converters import const_ints
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import is_const
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_dims
from autofuse.onnx_converters import stock
from autofuse.onnx_rewrite import rename_inputs

# the ops TVM's frontend hands a ShapeExpr to (onnx_frontend's `shape_compatible_ops`)
SHAPE_OPS = frozenset({"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand", "Concat",
                       "Equal", "Where", "Cast", "CastLike", "Squeeze"})
# what a shape-compatible op returns: a data tensor however its shape input was given
_DATA_FROM_SHAPE = frozenset({"Reshape", "Resize", "ConstantOfShape", "Expand"})
MARKER = "autofuse/shape_tensor/"
BRANCH_MARKER = "autofuse/branch_result/"


def shapes_as_tensors(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with a marker Cast (to int64, named MARKER...) before each input of an op
    outside SHAPE_OPS that may be a shape (computed from a Shape through shape-compatible ops),
    and how many; the model itself where there are none. An If's condition counts too."""
    shaped: set[str] = set()
    constant = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            constant.update(node.output)
        elif node.op_type == "Shape" or (node.op_type in SHAPE_OPS - _DATA_FROM_SHAPE
                                         and any(i in shaped for i in node.input)):
            shaped.update(node.output)
        elif any(i in shaped for i in node.input) and all(i in shaped or i in constant for i in node.input if i):
            shaped.update(node.output)  # arithmetic on shapes alone (an Unsqueeze of a size)
    readers = [(k, n) for k, n in enumerate(model.graph.node)
               if n.op_type not in SHAPE_OPS and any(i in shaped for i in n.input)]
    branches = [k for k, n in enumerate(model.graph.node) if n.op_type == "If"]
    if not readers and not branches:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    marked: dict[str, str] = {}
    inserted: list[tuple[int, onnx.NodeProto]] = []
    for k, _ in readers:
        node = nodes[k]
        for name in node.input:
            if name in shaped and name not in marked:
                marked[name] = f"{MARKER}{name}"
                inserted.append((k, helper.make_node("Cast", [name], [marked[name]], name=marked[name],
                                                     to=onnx.TensorProto.INT64)))
        rename_inputs(node, marked)
    for k in branches:  # each result of an If read through a marker Identity just after it
        results = list(nodes[k].output)
        del nodes[k].output[:]
        nodes[k].output.extend(f"{BRANCH_MARKER}{name}" for name in results)
        inserted.extend((k + 1, helper.make_node("Identity", [f"{BRANCH_MARKER}{name}"], [name],
                                                 name=f"{BRANCH_MARKER}{name}")) for name in results)
    for k, marker in sorted(inserted, key=lambda e: e[0], reverse=True):  # in the graph's order
        nodes.insert(k, marker)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, len(inserted)


def shape_tensor(x: relax.Expr) -> relax.Expr:
    """A marker Cast's result: a shape as the int64 tensor of its values, anything else as it is."""
    return relax.op.shape_to_tensor(x) if isinstance(x.ty, relax.ShapeType) else x


def is_size(x: relax.Expr | None) -> bool:
    """A scalar the frontend read from a shape: an int64 PrimValue (Gather of a shape at one
    index) or expression. (It folds float scalars computed from sizes into float immediates.)"""
    ty = getattr(x, "ty", None)
    return isinstance(ty, tvm.ir.PrimType) and str(ty.dtype) == "int64"


def size_tensor(x: relax.Expr, dtype: str = "int64") -> relax.Expr:
    """A size (is_size) as the 0-d tensor ONNX has it as (of `dtype`: beside a tensor of it)."""
    scalar = relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([x])), ())
    return scalar if dtype == "int64" else relax.op.astype(scalar, dtype)


def scalar_tensor(x: relax.Expr, dtype: str) -> relax.Expr | None:
    """A scalar operand the frontend made a PrimValue, as a 0-d tensor of `dtype`: a size
    (is_size), or a number (TVM's frontend folds float scalars computed from sizes, Mask R-CNN's
    30 / 28, into float immediates); None for anything else (not a PrimValue, or a float
    expression of sizes)."""
    if isinstance(x, (tirx.IntImm, tirx.FloatImm)):
        return relax.const(np.array(x.value, dtype), dtype)
    return size_tensor(x, dtype) if is_size(x) else None


def _sizes_beside_tensors(op: str) -> type:
    """`op` (elementwise arithmetic or a comparison) with a size or a number folded into a
    PrimValue (scalar_tensor) beside a tensor taking it as a 0-d tensor of the tensor's type. The
    stock converters make a size a 1-element tensor: Mask R-CNN's image padding, ceil(h / 32) * 32
    - h with h a resized image's height, came out [1] where ONNX has a scalar, and a Concat of
    such values unsqueezed failed ("Concat expects all input tensors to have same ndim"); a
    comparison of one failed to import ("Cannot use and / or / not operator to Expr"); TVM's
    ConvertLayout segfaults on a PrimValue operand. Sizes alone stay arithmetic on sizes (shapes
    stay static where they can)."""
    cls = stock(op)

    def with_tensors(impl):
        def convert(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
            tensors = [x for x in inputs if isinstance(getattr(x, "ty", None), relax.TensorType)]
            scalars = [scalar_tensor(x, str(tensors[0].ty.dtype)) if tensors else None for x in inputs]
            if any(t is not None for t in scalars):
                inputs = [x if t is None else bb.normalize(t) for x, t in zip(inputs, scalars)]
            return impl(bb, inputs, attr, params)
        return convert

    versions = sorted(int(name[len("_impl_v"):]) for name in dir(cls) if name.startswith("_impl_v"))
    return converter(op, {v: with_tensors(getattr(cls, f"_impl_v{v}")) for v in versions})


def _identity(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """Identity; a marker after an If types its result with sizes named at run time (a
    match_cast): TVM types an If's result by rank alone where its branches give tensors of
    different shapes (no box, or the boxes kept), and no op after it converted ("emit_te now
    only supports Tensor that has ShapeExpr shape")."""
    x = inputs[0]
    name = str(attr.get("tvm_custom", {}).get("name", ""))
    ty = x.ty
    if not name.startswith(BRANCH_MARKER) or not isinstance(ty, relax.TensorType) or ty.shape is not None \
            or ty.ndim < 0:
        return x
    dims = [tirx.Var(f"{name[len(BRANCH_MARKER):]}_{i}", "int64") for i in range(ty.ndim)]
    return bb.match_cast(x, relax.TensorType(dims, ty.dtype))


def _bound_at_run_time(bb: relax.BlockBuilder, values: relax.Expr, sizes: list) -> None:
    """Binds `sizes` (fresh variables, or expressions already bound, checked) to the values of
    the 1-d integer tensor `values` at run time."""
    shape = bb.emit(relax.op.tensor_to_shape(bb.normalize(relax.op.astype(values, "int64"))))
    bb.match_cast(shape, relax.ShapeType(sizes))


def sizes_read_or_named(bb: relax.BlockBuilder, expr: relax.Expr, name: str) -> list | None:
    """The values a 1-d integer tensor of known length holds, as sizes: those computed from
    shapes as their expressions, the others (read from the data: where Mask R-CNN pastes a mask
    in its box) fresh variables (`name`_k) bound to its values at run time. None for anything
    else."""
    from autofuse.onnx_corrections import shape_values  # (onnx_corrections imports this module)

    ty = getattr(expr, "ty", None)
    length = static_dims(ty) if isinstance(ty, relax.TensorType) else None
    if length is None or len(length) != 1 or not str(ty.dtype).startswith("int"):
        return None
    value = bb.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
    fields = value.args[0].fields if isinstance(value, relax.Call) and value.op == tvm.ir.Op.get("relax.concat") \
        and isinstance(value.args[0], relax.Tuple) else [expr]
    dims: list = []
    for field in fields:
        width = static_dims(getattr(field, "ty", None))
        if width is None or len(width) != 1:
            return None
        dims += shape_values(bb, field) or [None] * width[0]
    if len(dims) != length[0]:
        return None
    if any(d is None for d in dims):
        dims = [tirx.Var(f"{name}_{k}", "int64") if d is None else d for k, d in enumerate(dims)]
        _bound_at_run_time(bb, expr, dims)
    return dims


def _slice(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """Slice; one that keeps every axis it slices whole (from 0 to "the end", 2^63 - 1, as torch
    exports `x[:, None]`) is its input. TVM typed the result's length along an axis of a size
    known only at run time as min(2^63 - 1, n) (or max(n, 0)), which its analysis cannot reduce
    to n, and the broadcast of a [n, 4] tensor with that [.., 1] had an unknown shape, which
    nothing legalises (Faster R-CNN's batched NMS offsets)."""
    data = inputs[0]
    starts, ends, axes, steps = (const_ints(optional_input(inputs, i, params)) for i in range(1, 5))
    dims = list(data.ty.shape.values) if isinstance(getattr(data.ty, "shape", None), relax.ShapeExpr) else None
    if dims is not None and starts is not None and ends is not None and (steps is None or set(steps) == {1}):
        axes = [a % len(dims) for a in (axes if axes is not None else range(len(starts)))]
        if all(b == 0 and (e >= 2**62 or isinstance(dims[a], tirx.IntImm) and e >= int(dims[a]))
               for a, b, e in zip(axes, starts, ends)):
            return data
    given = [optional_input(inputs, i, params) is not None for i in (3, 4)]  # axes, steps (constant or not)
    if dims is not None and (starts is None or ends is None) and (axes is not None or not given[0]) \
            and (steps is not None and set(steps) == {1} or not given[1]):
        from autofuse.onnx_corrections import shape_values  # (onnx_corrections imports this module)

        # starts or ends computed at run time from sizes (torchvision's split of the boxes per
        # image): sliced by the sizes' expressions, its length then known as one
        begin = starts if starts is not None else shape_values(bb, inputs[1])
        end = ends if ends is not None else shape_values(bb, inputs[2])
        if begin is not None and end is not None and len(begin) == len(end):
            axes = [a % len(dims) for a in (axes if axes is not None else range(len(begin)))]
            return relax.op.strided_slice(data, axes, begin, end)
        # or read from the data (Mask R-CNN pasting each mask in its box)
        width = static_dims(getattr(inputs[1], "ty", None))
        if width is not None and len(width) == 1 and (axes is None or len(axes) == width[0]):
            axes = [a % len(dims) for a in (axes if axes is not None else range(width[0]))]
            name = str(attr.get("tvm_custom", {}).get("name", "slice"))
            return _slice_by_data(bb, data, inputs[1], inputs[2], axes, name)
    return stock("Slice")._impl_v13(bb, inputs, attr, params)


def _slice_by_data(bb: relax.BlockBuilder, data: relax.Expr, starts: relax.Expr, ends: relax.Expr,
                   axes: list[int], name: str) -> relax.Expr:
    """`data` sliced along `axes` (step 1) by bounds read from the data. The bounds are clamped
    into the axes as ONNX clamps them (a negative bound counts from the end; the end no lower
    than the start), then bound at run time to fresh sizes `name`_start_k and `name`_end_k, so
    the result's length is end - start. TVM's dynamic_strided_slice typed it by rank alone (no
    Shape of it imported), and FoldConstant left a dangling call of its shape function; TVM's
    strided_slice by the sizes unclamped clamps each bound into the axis but not the end to the
    start (a negative length)."""
    shape = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr(list(data.ty.shape.values))))
    extent = bb.normalize(relax.op.take(shape, relax.const(np.array(axes, "int64")), axis=0))

    def clamped(bound: relax.Expr, low: relax.Expr) -> relax.Expr:
        bound = bb.normalize(relax.op.astype(shape_tensor(bound), "int64"))
        counted = relax.op.where(relax.op.less(bound, relax.const(0, "int64")), relax.op.add(bound, extent), bound)
        return bb.normalize(relax.op.minimum(relax.op.maximum(counted, low), extent))

    first = clamped(starts, relax.const(0, "int64"))
    last = clamped(ends, first)
    k = len(axes)
    begin = [tirx.Var(f"{name}_start_{i}", "int64") for i in range(k)]
    end = [tirx.Var(f"{name}_end_{i}", "int64") for i in range(k)]
    _bound_at_run_time(bb, bb.normalize(relax.op.concat([first, last], 0)), begin + end)
    return relax.op.strided_slice(data, axes, begin, end, assume_inbound=True)


def _concat(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """Concat; a shape beside integer tensors computed from shapes is the shape of their values
    (Mask R-CNN's masks reshaped to [detections, 1, 28, 28]: TVM's converter takes shapes or
    tensors, not both, and refused the mix). Where a value cannot be read as such, the shapes
    are made tensors: a tensor, as ONNX has it."""
    from autofuse.onnx_corrections import shape_values  # (onnx_corrections imports this module)

    shapes = [isinstance(getattr(x, "ty", None), relax.ShapeType) for x in inputs]
    if not any(shapes):
        return _concat_tensors(bb, inputs, attr, params)
    if all(shapes):
        return stock("Concat")._impl_v13(bb, inputs, attr, params)
    parts = [list(x.ty.values) if shape and x.ty.values is not None else None if shape else shape_values(bb, x)
             for x, shape in zip(inputs, shapes)]
    if all(p is not None for p in parts):
        return relax.ShapeExpr([v for p in parts for v in p])
    return relax.op.concat([bb.normalize(shape_tensor(x)) for x in inputs], int(attr.get("axis", 0)))


def _concat_tensors(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """Concat of tensors whose sizes off the axis are different expressions of run-time sizes
    (Mask R-CNN's loop appends each pasted mask, [1, (expressions of its box), ...], to the masks
    so far, [n, h, w]). TVM cannot prove them equal, types the result by rank alone, and no
    kernel legalises it. ONNX has those sizes equal: each input is cast to common sizes there (a
    static size where one has it, else the first's), checked at run time."""
    dims = [list(x.ty.shape.values) if isinstance(getattr(getattr(x, "ty", None), "shape", None), relax.ShapeExpr)
            else None for x in inputs]
    if len(inputs) < 2 or any(d is None or len(d) != len(dims[0]) for d in dims) or not dims[0]:
        return stock("Concat")._impl_v13(bb, inputs, attr, params)
    rank = len(dims[0])
    axis = int(attr.get("axis", 0)) % rank
    common = [next((d[k] for d in dims if isinstance(d[k], tirx.IntImm)), dims[0][k]) for k in range(rank)]
    cast = [x if all(k == axis or tvm_ffi.structural_equal(d[k], common[k]) for k in range(rank))
            else bb.match_cast(x, relax.TensorType([d[axis] if k == axis else common[k] for k in range(rank)],
                                                    x.ty.dtype))
            for x, d in zip(inputs, dims)]
    return stock("Concat")._impl_v13(bb, cast, attr, params)


def _range(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """Range; integers up to a limit computed from run-time sizes are an arange sized by the
    sizes' expression. TVM's converter names its length a fresh variable, which nothing equates
    with the sizes (Mask R-CNN's `arange(detections) * 91 + labels`: an Add of two lengths TVM
    cannot prove equal, of unknown shape, and the import failed)."""
    from autofuse.onnx_corrections import shape_values  # (onnx_corrections imports this module)

    start, limit, delta = inputs[:3]
    first, step = const_int(start), const_int(delta)
    dtype = str(getattr(getattr(start, "ty", None), "dtype", ""))
    if first is not None and step and dtype.startswith(("int", "uint")) and not is_const(limit):
        # a size as the frontend hands it: a PrimValue (its expression in .value) or the expression
        until = [getattr(limit, "value", limit)] if is_size(limit) else shape_values(bb, limit)
        if until is not None and len(until) == 1:
            return relax.op.arange(first, until[0], step, dtype)
    return stock("Range")._impl_v12(bb, inputs, attr, params)


def _top_k(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list) -> relax.Expr:
    """TopK; a k computed from run-time sizes takes the best of its largest value where it has
    one (torchvision's min(1000, candidates)), the whole axis sorted where not, and keeps the
    first k. TVM's TopK keeps a heap of the k best: with k = -1 it sorted all of RetinaNet's
    490,734 candidates (16.7 ms a call, 84 ms over its 5; the best 1000 of them: about 1 ms);
    fewer candidates than that fill only their own places, and the slice keeps no more."""
    from autofuse.onnx_corrections import shape_values  # (onnx_corrections imports this module)

    if const_int(inputs[1]) is not None:
        return stock("TopK")._impl_v11(bb, inputs, attr, params)
    k = shape_values(bb, inputs[1])
    if k is None or len(k) != 1:
        raise ValueError("TopK's k is neither a constant nor computed from shapes")
    axis, largest = int(attr.get("axis", -1)), bool(attr.get("largest", 1))
    both = bb.emit(relax.op.topk(inputs[0], _largest(k[0]) or -1, axis, "both", largest, "int64"))
    axis %= inputs[0].ty.ndim
    # ONNX requires k <= the axis size: in bounds, the slice is k long (no clamping in its type)
    return relax.Tuple([bb.emit(relax.op.strided_slice(relax.TupleGetItem(both, i), [axis], [0], [k[0]],
                                                       assume_inbound=True))
                        for i in range(2)])


# a TopK's outputs are allocated at k's largest value (and TVM's heap takes k as an int32):
# beyond this many, every candidate is sorted instead
MAX_TOP_K = 1 << 16


def _largest(size: tirx.PrimExpr) -> int | None:
    """The largest value an expression of sizes (none below 0) can take, where it has one of at
    most MAX_TOP_K."""
    from autofuse.run_time_rows import sizes_analyzer

    top = int(sizes_analyzer(size).const_int_bound(size).max_value)
    return top if 0 < top <= MAX_TOP_K else None


CONVERTERS: dict[str, type] = {
    # before opset 10 k is an attribute: TVM's own converter
    "TopK": converter("TopK", {1: lambda bb, i, a, p: stock("TopK")._impl_v1(bb, i, a, p), 11: _top_k}),
    "Identity": converter("Identity", {1: _identity}),
    "Slice": converter("Slice", {13: _slice}),
    "Range": converter("Range", {11: _range}),
    "Concat": converter("Concat", {13: _concat}),  # the stock one's only version
    **{op: _sizes_beside_tensors(op) for op in ("Add", "Sub", "Mul", "Div", "Mod", "Greater", "Less",
                                                "GreaterOrEqual", "LessOrEqual")},
}
