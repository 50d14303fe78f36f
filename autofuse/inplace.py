"""Kernel outputs written over a dead input (Relax's call_tir_inplace).

A fused kernel whose last stages read one of its inputs element by element, at the position
they write (a convolution's or a projection's residual add), can write its output into that
input's memory once nothing reads the input afterwards. The input's cache lines are then read
and written back, instead of a fresh output buffer's lines also being fetched before they are
written; ONNX Runtime's Conv + Sum does the same. ResNet-50's 56x56 1x1 convolution + residual
add ran 602 us a call in the model, ONNX Runtime's 249; in-place, 315-329 us
(`scripts/vm_profile.py`, `scripts/ort_profile.py`).

It runs on the scheduled module, before the VM lowering: TIR's schedule primitives refuse a
kernel that reads a buffer after another block wrote it ("not a stage pipeline"), so kernels
are scheduled out of place and then made to write over their input; which inputs a kernel may
overwrite is read from the kernel as FuseTIR left it (a schedule computes the same function).

Kernel side: an input of the output's shape and dtype whose element i feeds only output element
i, through elementwise blocks each reading the previous one at the index it writes. Any schedule
then reads input element i before it writes output element i, and nothing else reads it; except
one whose last register tile overlaps the one before it (schedule._overlap_last_tile), which
reads rows again after writing them: such a kernel (RECOMPUTES_ATTR) stays out of place.
Relax side: the input is a tensor `main` computed into memory of its own (a kernel's output;
not a reshape, which the VM turns into a view of its input, nor a parameter, a constant, a tuple
field or anything a view was taken of), the call passes it once, and nothing reads it afterwards.
A kernel that several calls share is rewritten only where every call can run it in-place on the
same argument, so it keeps its name (per-kernel timings and reports use the names).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm import s_tir
from tvm import tirx

from autofuse.schedule import RECOMPUTES_ATTR
from autofuse.schedule import _is_one
from autofuse.schedule import new_schedule
from autofuse.schedule import static_buffers
from autofuse.tvm_bridge import call_tir_op
from autofuse.tvm_bridge import is_kernel_call


def reuse_dead_inputs(mod: tvm.IRModule, unscheduled: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every call_tir that may run in-place a call_tir_inplace (see the module
    docstring). `unscheduled`: the same module as FuseTIR left it, whose kernels are analysed."""
    main = mod["main"]
    if not isinstance(main, relax.Function) or not isinstance(main.body, relax.SeqExpr):
        return mod
    bindings = [b for block in main.body.blocks for b in block.bindings]
    last = {}  # variable -> position of the last binding that reads it (the return: after all)
    for pos, binding in enumerate(bindings):
        for var in relax.analysis.free_vars(binding.value):
            last[var] = pos
    for var in relax.analysis.free_vars(main.body.body):
        last[var] = len(bindings)
    owned: set[relax.Var] = set()  # tensors main computed into memory of their own, no views
    choice: dict[str, int | None] = {}  # kernel name -> the argument every call overwrites
    safe: dict[str, list[int] | None] = {}  # kernel name -> the inputs it may overwrite
    for pos, binding in enumerate(bindings):
        call = binding.value
        if not (isinstance(binding, relax.VarBinding) and is_kernel_call(call)):
            owned.difference_update(relax.analysis.free_vars(call))  # a tuple: memory now shared
            continue
        name = call.args[0].name_hint
        if name not in safe:
            prim = mod[call.args[0]]
            if not isinstance(prim, tirx.PrimFunc) or relax.analysis.has_reshape_pattern(prim):
                safe[name] = None  # a reshape: the VM makes it a view of its input
            elif (prim.attrs or {}).get(RECOMPUTES_ATTR):
                safe[name] = []  # its last tile reads rows the one before it has written
            else:
                safe[name] = _inplace_args(unscheduled[name]) if name in unscheduled else []
        if safe[name] is None or not call.op.same_as(call_tir_op()):  # a view, or already in place
            owned.difference_update(relax.analysis.free_vars(call))
            continue
        owned.add(binding.var)  # fresh memory, or (made in-place below) a dead input's
        k = _overwritable(call, safe[name], owned, last, pos)
        if k is not None and choice.get(name, k) == k:
            choice[name] = k
        else:
            choice[name] = None
    elsewhere = _kernels_called_outside_main(mod)
    chosen = {name: k for name, k in choice.items() if k is not None and name not in elsewhere}
    if not chosen:
        return mod
    retyped = {}  # kernel name -> (its new GlobalVar, the argument it overwrites, the kernel)
    for name, k in chosen.items():
        prim = mod[name]
        prim = prim.specialize({prim.params[-1]: prim.params[k]})  # the output is now input k
        bb = relax.BlockBuilder()  # a GlobalVar carries its function's signature: a new one
        retyped[name] = (bb.add_func(prim, name), k, prim)

    @relax.expr_functor.mutator
    class InPlace(relax.PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            new = super().visit_call_(call)
            if not new.op.same_as(call_tir_op()) or new.args[0].name_hint not in retyped:
                return new
            gv, k, _ = retyped[new.args[0].name_hint]
            return relax.op.call_tir_inplace(gv, new.args[1], [k], new.ty_args[0])

    functions = {}
    for gv, func in mod.functions.items():
        if gv.name_hint == "main":
            functions[gv] = InPlace(mod).visit_expr(func)
        elif gv.name_hint in retyped:
            new_gv, _, prim = retyped[gv.name_hint]
            functions[new_gv] = prim
        else:
            functions[gv] = func
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _kernels_called_outside_main(mod: tvm.IRModule) -> set[str]:
    """The kernels a function other than main calls, anywhere in it (a loop's function calls
    its counter's increment inside an If's branch: made in-place for main's calls alone, the
    loop's call passed it one argument too many at run time)."""
    called: set[str] = set()

    def visit(expr: relax.Expr) -> None:
        if is_kernel_call(expr):
            called.add(expr.args[0].name_hint)

    for gv, func in mod.functions.items():
        if gv.name_hint != "main" and isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return called


def _overwritable(
    call: relax.Call, safe: list[int], owned: set[relax.Var], last: dict[relax.Var, int], pos: int
) -> int | None:
    """The first of the kernel's `safe` inputs to which `call` (binding `pos`) passes a tensor
    of its own, once, that nothing reads afterwards."""
    if len(call.args) != 2 or not isinstance(call.args[1], relax.Tuple) or len(call.ty_args) != 1:
        return None  # symbolic shape arguments, or several outputs
    out = call.ty_args[0]
    args = list(call.args[1].fields)
    for k in safe:
        arg = args[k] if k < len(args) else None
        if not isinstance(arg, relax.Var) or arg not in owned or last.get(arg) != pos:
            continue
        if sum(a.same_as(arg) for a in args) != 1:
            continue
        ty = arg.ty
        if isinstance(ty, relax.TensorType) and isinstance(out, relax.TensorType) and ty.dtype == out.dtype \
                and tvm_ffi.structural_equal(ty.shape, out.shape):
            return k
    return None


def _inplace_args(prim: object) -> list[int]:
    """Inputs of the kernel's shape and dtype whose element i only ever feeds output element i:
    read by one elementwise block at the index it writes, whose result is read the same way by
    one block, and so on to the output (conv -> add -> relu; the epilogue blocks inline into
    one later, which changes no dependence). The output element is then written after its
    input element is read, whatever the schedule, and no other element reads it."""
    if not isinstance(prim, tirx.PrimFunc) or not prim.params:
        return []
    if not static_buffers(prim):
        return []  # sizes known only at run time (after NonMaxSuppression): out of place
    try:
        sch = new_schedule(prim)
        blocks = [sch.get(b) for b in _all_blocks(sch)]
    except Exception:  # noqa: BLE001 - a kernel TIR cannot analyse runs out of place
        return []
    out = prim.params[-1]
    if sum(any(w.source.same_as(p) for p in prim.params) for b in blocks for w in b.writes) != 1:
        return []  # several outputs, or one written by several blocks
    shape = [int(d) for d in out.shape]
    return [k for k, buf in enumerate(prim.params[:-1])
            if str(buf.dtype) == str(out.dtype) and [int(d) for d in buf.shape] == shape
            and _feeds_only_its_element(blocks, buf, out)]


def _feeds_only_its_element(blocks: list, buf: object, out: object) -> bool:
    if any(w.source.same_as(buf) for b in blocks for w in b.writes):
        return False
    for _ in blocks:  # each step moves to a block's output: at most one step per block
        readers = [b for b in blocks if any(r.source.same_as(buf) for r in b.reads)]
        if len(readers) != 1:
            return False
        blk = readers[0]
        # a reduction would overwrite its output element (its init) before its last read
        if len(blk.writes) != 1 or any(int(iv.iter_type) != 0 for iv in blk.iter_vars):
            return False
        written = blk.writes[0]
        if not all(_same_element(r.region, written.region) for r in blk.reads if r.source.same_as(buf)):
            return False
        if written.source.same_as(out):
            return True
        buf = written.source
    return False


def _same_element(read: list, write: list) -> bool:
    return len(read) == len(write) and all(
        tvm_ffi.structural_equal(a.min, b.min) and _is_one(a.extent) and _is_one(b.extent)
        for a, b in zip(read, write)
    )


def _all_blocks(sch: s_tir.Schedule) -> list:
    out, todo = [], [sch.get_sblock("root")]
    while todo:
        children = sch.get_child_blocks(todo.pop())
        out.extend(children)
        todo.extend(children)
    return out
