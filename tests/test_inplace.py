"""inplace.py: kernel outputs written over dead inputs, only where that cannot change a result."""

import numpy as np
import pytest
import tvm
from tvm import relax

from autofuse import apply
from autofuse import build
from autofuse.inplace import reuse_dead_inputs
from autofuse.schedule import pack_constants
from autofuse.workload import prepare

N = 32
RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((N, N)).astype("float32") / 4
W2 = RNG.standard_normal((N, N)).astype("float32") / 4


def _residual_block(variant: str) -> tvm.IRModule:
    """a = relu(2x); b = a @ W1; out = f(b @ W2 + residual): the residual add fuses into the
    second matmul's kernel, the one that may write its output over the residual."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((N, N), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(relax.op.multiply(x, relax.const(2.0, "float32"))))
            b = bb.emit(relax.op.matmul(a, relax.const(W1)))
            residual = {
                "dead": a,  # read for the last time by the residual add
                "parameter": x,  # the caller's tensor
            }.get(variant, a)
            if variant == "view":  # a reshape is a view of its input: writing it writes `a`
                residual = bb.emit(relax.op.reshape(relax.op.reshape(a, (N * N,)), (N, N)))
            c = bb.emit(relax.op.add(relax.op.matmul(b, relax.const(W2)), residual))
            out = relax.op.multiply(c, relax.const(3.0, "float32"))
            if variant in ("read_later", "view"):  # `a` is read again after the residual add
                out = relax.op.add(out, a)
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def _reference(variant: str, x: np.ndarray) -> np.ndarray:
    a = np.maximum(2 * x, 0)
    residual = x if variant == "parameter" else a
    out = 3 * ((a @ W1) @ W2 + residual)
    return out + a if variant in ("read_later", "view") else out


def _in_place_calls(mod: tvm.IRModule) -> list[str]:
    op = tvm.ir.Op.get("relax.call_tir_inplace")
    return [b.value.args[0].name_hint for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and b.value.op.same_as(op)]


@pytest.mark.parametrize("variant,in_place", [
    ("dead", 1), ("parameter", 0), ("read_later", 0), ("view", 0)])
def test_a_residual_add_writes_over_its_input_only_where_nothing_else_reads_it(variant, in_place):
    w = prepare(_residual_block(variant))
    fused = apply.apply_plan(w.mod, w.graph, w.tvm_default())
    target = build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    rewritten = reuse_dead_inputs(pack_constants(scheduled), fused)
    calls = _in_place_calls(rewritten)
    assert len(calls) == in_place
    if calls:  # the kernel lost its output parameter: it writes into its input
        assert len(rewritten[calls[0]].params) == len(fused[calls[0]].params) - 1
    x1, x2 = (RNG.standard_normal((N, N)).astype("float32") for _ in range(2))
    vm = relax.VirtualMachine(build.build(fused, target), tvm.cpu())
    out1 = vm["main"](tvm.runtime.tensor(x1))
    out2 = vm["main"](tvm.runtime.tensor(x2))
    # the returned tensor is the overwritten input's memory: a second call must not reuse it
    np.testing.assert_allclose(out1.numpy(), _reference(variant, x1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out2.numpy(), _reference(variant, x2), rtol=1e-4, atol=1e-4)


def test_kernels_are_timed_alone_as_the_executable_holds_them():
    # the in-place kernel lost its output parameter and the matmuls' weights were re-laid:
    # time_kernels calls them from the plan's own library with the signatures compiled there
    w = prepare(_residual_block("dead"))
    fused = apply.apply_plan(w.mod, w.graph, w.tvm_default())
    target = build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    ex, compiled = build.compile_repairing(fused, scheduled, target)
    names = [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    (in_place,) = _in_place_calls(compiled)
    assert len(compiled[in_place].params) == len(scheduled[in_place].params) - 1
    cfg = build.MeasureConfig(number=2, repeat=3, min_repeat_ms=0)
    times = build.time_kernels(ex, compiled, names, tvm.cpu(), cfg)
    assert set(times) == set(names) and all(t > 0 for t in times.values())
    with pytest.raises(Exception, match=r"Expected \d+ arguments"):  # the signatures before
        build.time_kernels(ex, scheduled, [in_place], tvm.cpu(), cfg)


def _kernel(epilogue):
    from tvm import te

    a, b, r = (te.placeholder((N, N), name=n) for n in ("A", "B", "R"))
    k = te.reduce_axis((0, N), name="k")
    c = te.compute((N, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, r, epilogue(c, r)])


@pytest.mark.parametrize("epilogue,inputs", [
    (lambda c, r: c, []),  # R is not read at all (and A, B are read across a reduction)
    (lambda c, r: te_add(c, r, lambda i, j: (i, j)), [2]),
    (lambda c, r: te_relu(te_add(c, r, lambda i, j: (i, j))), [2]),  # through a chain
    (lambda c, r: te_add(c, r, lambda i, j: (j, i)), []),  # element (j, i) feeds output (i, j)
    (lambda c, r: te_add(c, r, lambda i, j: (i, (j + 1) % N)), []),
])
def test_a_kernel_may_overwrite_an_input_only_each_of_whose_elements_feeds_its_own(epilogue, inputs):
    from autofuse.inplace import _inplace_args

    assert _inplace_args(_kernel(epilogue)) == inputs


def te_add(c, r, index):
    from tvm import te

    return te.compute((N, N), lambda i, j: c[i, j] + r[index(i, j)], name="add")


def te_relu(x):
    from tvm import te

    return te.compute((N, N), lambda i, j: te.max(x[i, j], 0.0), name="relu")


def test_a_kernel_called_where_one_call_cannot_run_in_place_stays_out_of_place():
    # one add kernel, two calls: the first one's inputs are both read again later, the second
    # one's first input is dead. Rewriting the shared kernel would break the first call;
    # renaming it would lose the name per-kernel timings use: both calls stay out of place
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((N, N), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.op.exp(a))
            c = bb.emit(relax.op.add(a, b))
            d = bb.emit(relax.op.exp(c))
            e = bb.emit(relax.op.add(d, b))
            out = bb.emit_output(relax.op.multiply(e, a))
        bb.emit_func_output(out)
    w = prepare(bb.get())
    fused = apply.apply_plan(w.mod, w.graph, w.unfused())
    target = build.make_target("llvm")
    adds = [gv.name_hint for gv in fused.get_global_vars() if gv.name_hint.startswith("add")]
    assert len(adds) == 1  # one kernel, two calls
    calls = _in_place_calls(reuse_dead_inputs(pack_constants(build.schedule(fused, target, "rules")), fused))
    assert calls == ["multiply"]  # e * a writes over e; neither add call is rewritten
    x = RNG.standard_normal((N, N)).astype("float32") / 4
    a = np.exp(x)
    b = np.exp(a)
    want = (np.exp(a + b) + b) * a
    got = build.run(build.build(fused, target), tvm.cpu(), [x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.parametrize("aliased", [False, True])
def test_a_tensor_also_reachable_through_a_tuple_is_not_overwritten(aliased):
    # normalisation folds such tuples away; the pass must not rely on it
    from tvm import te

    def kernel(fn, arity):
        xs = [te.placeholder((N, N), name=f"x{i}") for i in range(arity)]
        return te.create_prim_func([*xs, te.compute((N, N), lambda i, j: fn(*(x[i, j] for x in xs)), name="y")])

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((N, N), "float32"))
    exp = bb.add_func(kernel(te.exp, 1), "exp")
    add = bb.add_func(kernel(lambda p, q: p + q, 2), "add")
    mul = bb.add_func(kernel(lambda p, q: p * q, 2), "mul")
    ty = relax.TensorType((N, N), "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.call_tir(exp, [x], ty))
            alias = bb.emit(relax.TupleGetItem(bb.emit(relax.Tuple([a])), 0)) if aliased else x
            c = bb.emit(relax.call_tir(add, [x, a], ty))  # the last read of `a` by that name
            out = bb.emit_output(relax.call_tir(mul, [c, alias], ty))
        bb.emit_func_output(out)
    mod = bb.get()
    op = tvm.ir.Op.get("relax.call_tir_inplace")
    calls = [b.value.args[0].name_hint for blk in reuse_dead_inputs(mod, mod)["main"].body.blocks
             for b in blk.bindings if isinstance(b.value, relax.Call) and b.value.op.same_as(op)]
    assert calls == (["mul"] if aliased else ["add", "mul"])  # c is dead after the last call


@pytest.mark.parametrize("in_branch", [False, True])
def test_a_kernel_another_function_calls_too_is_left_out_of_place(in_branch):
    # only main's calls are analysed; rewriting the kernel would change another function's call.
    # `in_branch`: the other function calls it inside an If's branch (a loop's function calls its
    # counter's increment so): once missed, the kernel went in-place and that call failed at run
    # time ("Expected 1 arguments")
    from tvm import te

    xs = [te.placeholder((N, N), name=f"x{i}") for i in range(2)]
    add_kernel = te.create_prim_func([*xs, te.compute((N, N), lambda i, j: xs[0][i, j] + xs[1][i, j], name="y")])
    bb = relax.BlockBuilder()
    add = bb.add_func(add_kernel, "add")
    exp = bb.add_func(te.create_prim_func([xs[0], te.compute((N, N), lambda i, j: te.exp(xs[0][i, j]), name="e")]), "exp")
    ty = relax.TensorType((N, N), "float32")
    for name in ("main",) if in_branch else ("main", "other"):
        x = relax.Var("x", ty)
        with bb.function(name, [x]):
            with bb.dataflow():
                a = bb.emit(relax.call_tir(exp, [x], ty))
                out = bb.emit_output(relax.call_tir(add, [a, x], ty))  # `a` is dead: main's may run in place
            bb.emit_func_output(out)
    mod = bb.get()
    if in_branch:
        x, flag, y, v = relax.Var("x", ty), relax.Var("flag", relax.TensorType((), "bool")), relax.Var("y", ty), \
            relax.Var("v", ty)
        then = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(y, relax.call_tir(add, [x, x], ty))])], y)
        body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(v, relax.If(flag, then, relax.SeqExpr([], x)))])], v)
        mod[relax.GlobalVar("other")] = relax.Function([x, flag], body, ty)
    assert _in_place_calls(reuse_dead_inputs(mod, mod)) == []
    assert _in_place_calls(reuse_dead_inputs(tvm.IRModule({gv: f for gv, f in mod.functions.items()
                                                            if gv.name_hint != "other"}), mod)) == ["add"]


def test_a_kernel_whose_last_tile_recomputes_rows_keeps_its_output_apart():
    # a 13x13 image's 169 rows in register tiles that do not divide them: the last tile overlaps
    # the one before it (schedule._overlap_last_tile) and reads those rows' residual again after
    # that tile wrote them; written in place, the residual would be added twice there
    from autofuse.schedule import RECOMPUTES_ATTR

    side, c = 13, 64
    weight = RNG.standard_normal((3, 3, c, c)).astype("float32") / 24
    pointwise = RNG.standard_normal((1, 1, c, c)).astype("float32") / 8
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, side, side, c), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(relax.op.multiply(x, relax.const(2.0, "float32"))))
            # a kernel of its own (a convolution does not fuse into another), read by the add alone
            residual = bb.emit(relax.op.nn.conv2d(x, relax.const(pointwise), data_layout="NHWC", kernel_layout="HWIO"))
            conv = relax.op.nn.conv2d(a, relax.const(weight), padding=1, data_layout="NHWC", kernel_layout="HWIO")
            out = bb.emit_output(relax.op.multiply(relax.op.add(conv, residual), relax.const(3.0, "float32")))
        bb.emit_func_output(out)
    w = prepare(bb.get())
    fused = apply.apply_plan(w.mod, w.graph, w.tvm_default())
    target = build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    (conv_kernel,) = [gv.name_hint for gv in scheduled.get_global_vars()
                      if "conv2d" in gv.name_hint and "add" in gv.name_hint]
    assert (scheduled[conv_kernel].attrs or {}).get(RECOMPUTES_ATTR)
    assert conv_kernel not in _in_place_calls(reuse_dead_inputs(pack_constants(scheduled), fused))
    xs = RNG.standard_normal((1, side, side, c)).astype("float32")
    vm = relax.VirtualMachine(build.build(fused, target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs)).numpy()
    a_np = np.pad(np.maximum(2 * xs, 0), ((0, 0), (1, 1), (1, 1), (0, 0)))
    conv_np = sum(a_np[:, i:i + side, j:j + side, :] @ weight[i, j] for i in range(3) for j in range(3))
    np.testing.assert_allclose(got, 3 * (conv_np + xs @ pointwise[0, 0]), rtol=1e-4, atol=1e-4)
