"""ONNX Loops whose trip count or condition is known only at run time, as recursive Relax functions.

onnx_loop unrolls a Loop of a constant count. torchvision's Keypoint and Mask R-CNN exports loop
over the detections NMS kept, a number known only at run time, and TVM's frontend has no Loop
converter. Relax has no loop construct either, but a function may call itself under an If, which
the VM runs. Here a Loop node becomes two functions:

    body(i, cond, carried..., captured...) -> (cond', carried'..., scan elements...)
        the body graph imported by TVM's frontend as a model of its own: the values it reads from
        the enclosing graph are extra inputs (constants are copied in as initializers, so that
        its shape arithmetic still folds them);
    loop(i, trips, cond, carried..., scans..., captured...) =
        if i < trips and cond: loop(i + 1, trips, body's cond', carried'..., scans + elements, captured...)
        else: (carried..., scans...)

and the node a call of `loop` from i = 0. A carried value whose sizes change from one iteration to
the next (keypoints appended per detection) is typed with sizes named per function instead of its
initial ones; after the call each output is cast to sizes of its own (its initial ones where the
body keeps them), which the ops after it read. A scan output grows by a Concat per iteration (these
loops run over at most a few hundred detections), so its elements need a static shape. The
functions' kernels are scheduled like any other, but they stay out of fusion plans: autofuse's plans
group the main function's operators.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import tvm
from onnx import helper
from onnx import numpy_helper
from tvm import relax
from tvm import tirx

from autofuse.onnx_constants import names_read
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import is_const
from autofuse.onnx_converters import static_dims
from autofuse.onnx_converters import static_values

NO_LIMIT = 2**63 - 1  # ONNX: a Loop without a trip count runs until its condition is false


class LoopError(ValueError):
    """A Loop these functions cannot express (the import then fails with its message)."""


def _loop(bb: relax.BlockBuilder, inputs: list, attr: dict, params: list, opset: int) -> relax.Expr:
    body: onnx.GraphProto = attr["body"]
    trips, cond = (None if x is None else _scalar(_as_tensor(bb, x), dtype) for x, dtype in
                   zip(inputs[:2], ("int64", "bool")))
    if trips is None and cond is None:
        raise LoopError("a Loop with neither a trip count nor a condition never ends")
    carried = [_as_tensor(bb, x) for x in inputs[2:]]
    n = len(carried)
    captured, constants = _captured(bb, body, params[0])
    states = [x.ty for x in carried]
    while True:  # each pass makes at least one size a run-time one, or ends
        body_mod = _import(_body_model(body, opset, states, [(name, x.ty) for name, x in captured], constants))
        returned = _fields(body_mod["main"].ret_ty)
        widened = [_widened(s, r) for s, r in zip(states, returned[1:1 + n])]
        if all(w is s for w, s in zip(widened, states)):
            break
        states = widened
    elements = returned[1 + n:]
    if any(static_dims(e) is None for e in elements):
        raise LoopError("a Loop's scan output has elements of a run-time shape (only static ones are stacked)")
    name = bb.get_unique_name("loop")
    mod, loop = _loop_function(body_mod, name, n, elements)
    loop = _merge(bb, mod, loop)
    first = [relax.const(0, "int64"), trips if trips is not None else relax.const(NO_LIMIT, "int64"),
             cond if cond is not None else relax.const(True, "bool")]
    empty = [relax.op.zeros(relax.ShapeExpr([0, *static_dims(e)]), e.dtype) for e in elements]
    result = bb.emit(relax.Call(loop, [*first, *carried, *empty, *[x for _, x in captured]]))
    outputs = []
    for k, ty in enumerate([*states, *[_stacked(e) for e in elements]]):
        outputs.append(bb.match_cast(bb.emit(relax.TupleGetItem(result, k)), _named_sizes(ty, f"{name}_out{k}")))
    return outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)


def _as_tensor(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    """`x` as a tensor: the frontend hands sizes read from shapes over as shapes or scalars."""
    from autofuse.onnx_sizes import is_size
    from autofuse.onnx_sizes import shape_tensor
    from autofuse.onnx_sizes import size_tensor

    x = bb.normalize(size_tensor(x) if is_size(x) else shape_tensor(x))
    if not isinstance(x.ty, relax.TensorType) or x.ty.ndim < 0:
        raise LoopError(f"a value a Loop reads is a {type(x.ty).__name__} of no known rank, not a tensor")
    return x


def _scalar(x: relax.Expr, dtype: str) -> relax.Expr:
    """A trip count or condition as a scalar tensor of `dtype` (ONNX allows shape [] or [1])."""
    return relax.op.astype(relax.op.reshape(x, ()), dtype)


def _captured(bb: relax.BlockBuilder, body: onnx.GraphProto, nodes: dict) -> tuple[list, list[onnx.TensorProto]]:
    """The values `body` reads from the enclosing graph: (name, value) of those computed at run
    time, and the constants among them as initializers."""
    local = {i.name for i in body.input} | {t.name for t in body.initializer} | {o for n in body.node for o in n.output}
    outer = sorted((names_read(body) | {o.name for o in body.output}) - local - {""})
    captured, constants = [], []
    for name in outer:
        value, sizes = nodes[name], static_values(nodes[name])
        if is_const(value):
            constants.append(numpy_helper.from_array(value.value.numpy(), name))
        elif sizes is not None:
            constants.append(numpy_helper.from_array(np.array(sizes, np.int64), name))
        elif isinstance(value, tirx.IntImm):  # a size the frontend read from a static shape
            constants.append(numpy_helper.from_array(np.array(int(value), str(value.ty)), name))
        else:
            captured.append((name, _as_tensor(bb, value)))
    return captured, constants


def _body_model(body: onnx.GraphProto, opset: int, states: list, captured: list, constants: list) -> onnx.ModelProto:
    """The body graph as a model of its own: inputs the iteration number, the condition, the
    carried values (typed `states`) and the run-time values it reads from the enclosing graph."""
    graph = onnx.GraphProto()
    graph.CopyFrom(body)
    del graph.input[:]
    graph.input.extend([_value_info(body.input[0].name, relax.TensorType([], "int64")),
                        _value_info(body.input[1].name, relax.TensorType([], "bool"))])
    graph.input.extend(_value_info(v.name, ty) for v, ty in zip(body.input[2:], states))
    graph.input.extend(_value_info(name, ty) for name, ty in captured)
    graph.initializer.extend(constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _value_info(name: str, ty: relax.TensorType) -> onnx.ValueInfoProto:
    """An ONNX input of the Relax type `ty`; a size not static is named (n_`name`_k), as is a
    size of 0, which the frontend reads as unknown."""
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise LoopError(f"a Loop's value {name!r} has no known rank")
    dims = ty.shape.values if isinstance(ty.shape, relax.ShapeExpr) else [None] * ty.ndim
    named = re.sub(r"\W", "_", name)  # the frontend parses a named size as an expression: '/' divides
    shape = [int(d) if isinstance(d, tirx.IntImm) and int(d) > 0 else f"n_{named}_{k}" for k, d in enumerate(dims)]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(str(ty.dtype)))
    return helper.make_tensor_value_info(name, elem, shape)


def _import(model: onnx.ModelProto) -> object:
    """The body model as TVM's frontend imports it, with autofuse's rewrites before import
    (the frontend's converters, autofuse's included, are those registered for the whole model)."""
    from tvm.relax.frontend.onnx import from_onnx

    from autofuse import onnx_contrib
    from autofuse import onnx_loop
    from autofuse import onnx_sizes

    model, _ = onnx_loop.unroll(model)
    model, _ = onnx_contrib.tag(model)
    model, _ = onnx_sizes.shapes_as_tensors(model)
    return from_onnx(model, keep_params_in_input=False)


def _fields(ty: object) -> list:
    """The types of a function's results."""
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


def _widened(state: relax.TensorType, returned: relax.TensorType) -> relax.TensorType:
    """`state` where the body returns its carried value with the same type and static sizes;
    otherwise a type whose sizes the body changes are not static (the same rank and dtype)."""
    if not isinstance(returned, relax.TensorType) or returned.ndim != state.ndim or returned.dtype != state.dtype:
        raise LoopError("the Loop's carried values change rank or type from one iteration to the next")
    before = state.shape.values if isinstance(state.shape, relax.ShapeExpr) else [None] * state.ndim
    after = returned.shape.values if isinstance(returned.shape, relax.ShapeExpr) else [None] * state.ndim
    kept = [b if isinstance(b, tirx.IntImm) and isinstance(a, tirx.IntImm) and int(a) == int(b) else None
            for b, a in zip(before, after)]
    if all(k is not None or not isinstance(b, tirx.IntImm) for k, b in zip(kept, before)):
        return state
    return _named_sizes(relax.TensorType([k if k is not None else -1 for k in kept], state.dtype), "")


def _stacked(element: relax.TensorType) -> relax.TensorType:
    """The type of a scan output of (static) `element`s: their number is the run-time size -1."""
    return relax.TensorType([-1, *static_dims(element)], element.dtype)


def _named_sizes(ty: relax.TensorType, name: str) -> relax.TensorType:
    """`ty` with each size that is not a static one (or is -1) a fresh symbolic variable."""
    dims = ty.shape.values if isinstance(ty.shape, relax.ShapeExpr) else [None] * ty.ndim
    sizes = [d if isinstance(d, tirx.IntImm) and int(d) >= 0 else tirx.Var(f"{name}_n{k}", "int64")
             for k, d in enumerate(dims)]
    return relax.TensorType(sizes, ty.dtype)


def _loop_function(body_mod: object, name: str, n: int, elements: list) -> tuple[object, object]:
    """The module with `body` (the body graph's main function, renamed) and the recursive loop
    function beside it; the loop function's GlobalVar."""
    body_func = body_mod["main"]
    body_func = relax.Function(body_func.params, body_func.body, body_func.ret_ty, body_func.is_pure)
    mod = {gv: f for gv, f in body_mod.functions_items() if gv.name_hint != "main"}
    module = tvm.IRModule(mod)
    bb = relax.BlockBuilder(module)
    body_gv = bb.add_func(body_func, f"{name}_body")
    body_params = list(body_func.params)
    carried_types = [p.ty for p in body_params[2:2 + n]]
    captured_types = [p.ty for p in body_params[2 + n:]]
    scan_types = [_stacked(e) for e in elements]
    params = [relax.Var("i", relax.TensorType([], "int64")), relax.Var("trips", relax.TensorType([], "int64")),
              relax.Var("cond", relax.TensorType([], "bool"))]
    params += [relax.Var(f"v{k}", _named_sizes(t, f"v{k}")) for k, t in enumerate(carried_types)]
    params += [relax.Var(f"scan{k}", _named_sizes(t, f"scan{k}")) for k, t in enumerate(scan_types)]
    params += [relax.Var(f"outer{k}", _named_sizes(t, f"outer{k}")) for k, t in enumerate(captured_types)]
    ret = relax.TupleType([relax.TensorType(ndim=t.ndim, dtype=t.dtype) for t in [*carried_types, *scan_types]])
    state = params[3:3 + n + len(scan_types)]
    placeholder = relax.Function(params, relax.SeqExpr([], relax.Tuple(state)), ret, True)
    loop_gv = bb.add_func(placeholder, name)
    i, trips, cond = params[:3]
    carried, scans, outer = params[3:3 + n], params[3 + n:3 + n + len(elements)], params[3 + n + len(elements):]
    with bb.function(f"{name}_impl", params, private=True):
        go = bb.emit(relax.op.logical_and(relax.op.less(i, trips), cond))
        bb._begin_binding_block()
        out = bb.emit(relax.Call(body_gv, [i, cond, *carried, *outer]))
        fields = [bb.emit(relax.TupleGetItem(out, k)) for k in range(1 + n + len(elements))] \
            if isinstance(body_func.ret_ty, relax.TupleType) else [out]
        more = bb.emit(relax.op.astype(relax.op.reshape(fields[0], ()), "bool"))
        nxt = [bb.match_cast(v, _named_sizes(p.ty, f"next{k}"))
               for k, (v, p) in enumerate(zip(fields[1:1 + n], carried))]
        grown = [bb.emit(relax.op.concat([s, relax.op.expand_dims(e, 0)], 0)) for s, e in zip(scans, fields[1 + n:])]
        again = bb.emit(relax.Call(loop_gv, [bb.emit(relax.op.add(i, relax.const(1, "int64"))), trips, more,
                                              *nxt, *grown, *outer]))
        then = relax.SeqExpr([bb._end_block()], again)
        bb._begin_binding_block()
        done = bb.emit(relax.Tuple(state))
        otherwise = relax.SeqExpr([bb._end_block()], done)
        result = bb.emit(relax.If(go, then, otherwise))
        impl_gv = bb.emit_func_output(result)
    built = bb.get()
    bb.update_func(loop_gv, relax.Function(params, built[impl_gv].body, ret, True))
    built = bb.get()
    return tvm.IRModule({gv: f for gv, f in built.functions_items() if gv.name_hint != impl_gv.name_hint}), loop_gv


def _merge(bb: relax.BlockBuilder, mod: object, root: object) -> object:
    """Add `mod`'s functions to the module `bb` builds (names made unique, kernels it already
    holds shared), calls between them relinked; the GlobalVar `root` now has there."""
    gvs = {gv.name_hint: bb.add_func(f, gv.name_hint) for gv, f in mod.functions_items()}

    @relax.expr_functor.mutator
    class _Relink(relax.PyExprMutator):
        def visit_global_var_(self, op: object) -> object:
            return gvs.get(op.name_hint, op)

    for gv, f in mod.functions_items():
        if isinstance(f, relax.Function):
            bb.update_func(gvs[gv.name_hint], _Relink().visit_expr(f))
    return gvs[root.name_hint]


CONVERTERS: dict[str, type] = {
    "Loop": converter("Loop", {v: (lambda bb, inputs, attr, params, v=v: _loop(bb, inputs, attr, params, v))
                               for v in range(1, 30)}),
}
