"""Converters added to TVM's Relax ONNX frontend for operators it lacks, and their shared helpers.

The frontend looks converters up through its module-level `_get_convert_map()` for every node,
so wrapping that one function registers ours for the duration of an import (`registered`). Each
converter module (`onnx_rnn`, `onnx_dft`) exports a CONVERTERS map of op type -> converter class.
Shapes are static in autofuse (the importer fixes input shapes), which is what lets these
converters unroll a recurrence or build a transform's matrix from the shapes they see.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import tvm
from tvm import relax


def array_const(value: np.ndarray) -> relax.Constant:
    """A constant of the array's own dtype (relax.const makes a float64 array float32)."""
    return relax.const(value, str(value.dtype))


def const_like(value: float, like: relax.Expr) -> relax.Constant:
    """A scalar constant of `like`'s dtype (a coefficient in an expression on `like`)."""
    return relax.const(value, str(like.ty.dtype))


def text(value: bytes | str) -> str:
    """A string attribute as the frontend hands it over (bytes) or as a default (str)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def element_dtype(code: int) -> str:
    """The dtype an ONNX TensorProto element type names (1 float32, 10 float16, 16 bfloat16...)."""
    import onnx

    return str(onnx.helper.tensor_dtype_to_np_dtype(code))


def calls_op(expr: object, name: str) -> bool:
    """Whether `expr` is a call of the Relax operator `name` ("relax.reshape")."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def is_const(expr: relax.Expr | None) -> bool:
    return isinstance(expr, tvm.ir.expr.GenericConst)


def const_int(expr: relax.Expr | None) -> int | None:
    """The integer a constant input holds (an axis, a length), None where it is not a constant."""
    return int(expr.value.numpy().reshape(-1)[0]) if is_const(expr) else None


def const_ints(expr: relax.Expr | None) -> list[int] | None:
    """The integers a constant input holds (a shape, sizes), None where it is not a constant."""
    return [int(v) for v in expr.value.numpy().reshape(-1)] if is_const(expr) else None


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """The expression's shape, or None where its rank or a dimension is unknown."""
    return static_dims(expr.ty)


def static_dims(ty: object) -> tuple[int, ...] | None:
    """A tensor type's shape, or None where its rank or a dimension is unknown (or it is no
    tensor type)."""
    try:
        return tuple(int(v) for v in ty.shape.values)
    except (AttributeError, TypeError):  # unknown rank or a symbolic dimension
        return None


def static_values(expr: relax.Expr | None) -> list[int] | None:
    """The sizes of a shape expression whose sizes are all known (the frontend computes shapes of
    static tensors as such), None for anything else."""
    if not isinstance(expr, relax.ShapeExpr) or not all(isinstance(v, tvm.tirx.IntImm) for v in expr.values):
        return None
    return [int(v) for v in expr.values]


def optional_input(inputs: list, i: int, params: list) -> relax.Expr | None:
    """Optional input `i` (absent: None); a parameter becomes the constant it holds."""
    expr = inputs[i] if len(inputs) > i else None
    if isinstance(expr, relax.Var):
        from tvm.relax.frontend.onnx.onnx_frontend import get_constant

        return get_constant(expr, params)
    return expr


def heads_first(bb: relax.BlockBuilder, x: relax.Expr, heads: int) -> relax.Expr:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    b, s, hidden = static_shape(x)  # type: ignore[misc]
    return bb.emit(relax.op.permute_dims(relax.op.reshape(x, [b, s, heads, hidden // heads]), [0, 2, 1, 3]))


def stock(op: str) -> type:
    """TVM's own converter class for `op` (to hand the common case back to it)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return getattr(onnx_frontend, op)


def converter(op: str, versions: dict[int, Callable[[relax.BlockBuilder, list, dict, list], relax.Expr]]) -> type:
    """A frontend converter class for `op`: `versions` maps the opset each implementation
    starts at to it (the frontend takes the latest one at or below the model's opset)."""
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    def impl(convert: Callable) -> classmethod:
        return classmethod(lambda cls, bb, inputs, attr, params: convert(bb, inputs, attr, params))

    return type(op, (OnnxOpConverter,), {f"_impl_v{v}": impl(c) for v, c in versions.items()})


@contextmanager
def registered(converters: dict[str, type]) -> Iterator[None]:
    """TVM's ONNX frontend with `converters` added (the stock map restored on exit)."""
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    stock = fe._get_convert_map
    fe._get_convert_map = lambda: {**stock(), **converters}
    try:
        yield
    finally:
        fe._get_convert_map = stock
