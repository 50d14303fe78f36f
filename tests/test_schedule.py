import re

import numpy as np
import pytest
import tvm

from autofuse import apply
from autofuse import build
from autofuse import schedule
from autofuse.importer import random_inputs
from autofuse.schedule import SCHEDULED_ATTR
from autofuse.schedule import ScheduleCPU
from autofuse.schedule import schedule_candidates
from autofuse.schedule import schedule_cpu
from autofuse.schedule import vector_bits
from autofuse.space import SearchSpace


def test_matmul_gets_register_tiled_gemm(mlp):
    fused, kernels = apply.fuse(mlp.mod, mlp.graph, mlp.tvm_default())
    name = next(k for k in kernels if k.startswith("fused_matmul"))
    text = schedule_cpu(fused[name]).script()
    assert "T.vectorized" in text and "_init" in text
    # the MLP's matmuls are too small to pay for waking a second thread
    assert "T.parallel" not in text
    assert SCHEDULED_ATTR in schedule_cpu(fused[name]).attrs


def _register_tiled(text: str) -> bool:
    """Whether a scheduled kernel keeps a register tile's accumulators in a buffer of their own
    (cache_write's: local scope in the workspace pool, global under the stack limit)."""
    return re.search(r"\w+_(local|global)(_\d+)? = T\.sblock_alloc_buffer", text) is not None


def _matmul(m, n, k, lanes_dtype="float32"):
    from tvm import te

    a = te.placeholder((m, k), lanes_dtype, name="A")
    b = te.placeholder((k, n), lanes_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


def test_register_tiles_under_the_stack_limit_take_no_workspace_calls():
    # TVM's lowering gives a buffer inside a parallel loop the runtime's workspace pool (a call
    # to allocate and one to free at every tile) unless it is global and under 1 KiB
    func = schedule_cpu(_matmul(256, 512, 512), lanes=8, acc=12)
    assert "T.parallel" in func.script()
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    assert "TVMBackendAllocWorkspace" not in lib.mod.inspect_source("ll")


def test_pooled_register_tiles_are_allocated_once_per_run_of_tiles(monkeypatch):
    import autofuse.schedule as schedule

    monkeypatch.setattr(schedule, "STACK_BYTES", 0)  # every tile as large as AVX-512's 8x3
    func = schedule_cpu(_matmul(256, 512, 512), lanes=8, acc=12)
    lines = func.script().splitlines()
    # 2048 tiles (4x2 vectors): 128 parallel runs of 16, one allocation per run
    assert any('scope="local"' in line for line in lines)
    par = next(k for k, line in enumerate(lines) if "T.parallel" in line)
    assert "T.parallel(128)" in lines[par] and "in range(16)" in lines[par + 1]
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    rng = np.random.default_rng(0)
    a, b = rng.random((256, 512), "float32"), rng.random((512, 512), "float32")
    out = tvm.runtime.tensor(np.zeros((256, 512), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)


def test_big_matmul_runs_in_parallel_and_narrow_outputs_still_vectorise():
    text = schedule_cpu(_matmul(256, 512, 512), lanes=16).script()
    assert "T.parallel" in text and "T.vectorized" in text
    # 8 output columns on a 16-lane machine: half-width vectors, not a scalar loop
    narrow = schedule_cpu(_matmul(64, 8, 64), lanes=16)
    assert "T.vectorized(8)" in narrow.script()
    a, b = np.random.rand(64, 64).astype("float32"), np.random.rand(64, 8).astype("float32")
    lib = tvm.compile(tvm.IRModule({"main": narrow}), target="llvm")
    out = tvm.runtime.tensor(np.zeros((64, 8), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def _run_matmul(func, m, n, k):
    a, b = np.random.rand(m, k).astype("float32"), np.random.rand(k, n).astype("float32")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    out = tvm.runtime.tensor(np.zeros((m, n), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def _predicated_blocks(func):
    """Names of the blocks of `func` that carry a predicate (a T.where before their reads)."""
    chunks = func.script().split('with T.sblock("')[1:]
    return [c.split('"')[0] for c in chunks if "T.where" in c.split("T.reads")[0]]


def test_prime_row_count_gets_a_padded_row_tile():
    # 17 rows (ViT's tokens): a 9-row tile (AVX-512's 24 accumulators: 9 rows x 2 vectors;
    # with 16 it was 6 rows) rather than 1 row, over rows padded to 18, so that no step of the
    # reduction is predicated (a predicated row kept its accumulator in memory: ViT's
    # 17x128x512 projection 59 -> 25-38 us); only the copy back of the output tests rows
    func = schedule_cpu(_matmul(17, 32, 64), lanes=16)
    text = func.script()
    assert "T.unroll(9)" in text and "A_pad" in text
    assert _predicated_blocks(func) == ["C_pad"]  # the copy back, not C_init/C_update
    _run_matmul(func, 17, 32, 64)


def test_five_vectors_of_columns_get_tiles_five_vectors_wide():
    # 40 output channels at 8 lanes (EfficientNet's, MobileNetV3's): AVX-512's 24 accumulators
    # hold 4 rows x 5 vectors, which reuse each load far more than the 16 x 1 tiles 2 and 3 left
    func = schedule_cpu(_matmul(112, 40, 64), lanes=16)
    text = func.script()
    assert "T.unroll(4)" in text and "T.unroll(5)" in text and "T.vectorized(8)" in text
    _run_matmul(func, 112, 40, 64)
    # AVX2's 12 accumulators hold no 4 rows of them: one vector wide, as before
    func = schedule_cpu(_matmul(112, 40, 64), lanes=8, acc=12)
    assert "T.unroll(5)" not in func.script() and "T.unroll(8)" in func.script()
    _run_matmul(func, 112, 40, 64)


def test_row_tiles_fit_the_cpu_registers():
    from autofuse.schedule import accumulators

    assert accumulators(512) == 24 and accumulators(256) == 12
    # AVX2, 12 accumulators: 128 rows in exact 4-row tiles (a padded 6-row tile ran slower)
    func = schedule_cpu(_matmul(128, 64, 64), lanes=8, acc=accumulators(256))
    assert "T.unroll(4)" in func.script() and "_pad" not in func.script() and not _predicated_blocks(func)
    _run_matmul(func, 128, 64, 64)
    # 7 rows, no vector pair fits 12 accumulators with them: 7 rows x 1 vector, not 1 x 2
    func = schedule_cpu(_matmul(7, 16, 32), lanes=8, acc=accumulators(256))
    assert "T.unroll(7)" in func.script()
    _run_matmul(func, 7, 16, 32)
    # AVX-512: 24 accumulators, 8 rows by 2 vectors where 4 vectors of columns leave no third
    assert "T.unroll(8)" in schedule_cpu(_matmul(128, 64, 64), lanes=16).script()


def test_pooling_is_not_register_tiled_and_its_padding_is_inlined():
    # a pooling window reuses no input across outputs: the register tile ran SqueezeNet's 3x3
    # max pool at 108 us against 21 for the plain loops; its padding's test depends on the image
    # position only, and inlined it ran 4.5 us against 11 as a copy of its own
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 15, 15), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1))
        bb.emit_func_output(out)
    from autofuse.workload import prepare

    w = prepare(bb.get())
    fused = apply.apply_plan(w.mod, w.graph, w.tvm_default())
    pools = [f for gv, f in fused.functions.items() if "pool" in gv.name_hint]
    assert pools
    for func in pools:
        texts = [c.script() for c in schedule_candidates(func, lanes=8, acc=12)]
        assert texts and not [t for t in texts if 'scope="local"' in t]
        # the loop-nest schedule (the row kernel keeps its own copy, computed per channel)
        assert [t for t in texts if 'sblock("pad_temp")' not in t]
    target = build.make_target("llvm")
    feeds = random_inputs(w.inputs)
    want, got = (build.run(build.build(fused, target, s), tvm.cpu(), feeds) for s in ("none", "rules"))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


@pytest.mark.parametrize("n,k", [(1000, 1280), (40, 24)])
def test_one_row_matmul_keeps_its_outputs_in_register_accumulators(n, k):
    # a batch-1 classifier head (EfficientNet's 1280 -> 1000): as a dot product per output down a
    # strided column of B it took 1.75 ms; k outside, the row of outputs in vector registers and
    # B read a row at a time it takes 0.06-0.16 ms (bound by reading B)
    func = schedule_cpu(_matmul(1, n, k), lanes=16)
    text = func.script()
    # the outputs' accumulators: a buffer of their own (in global scope: on the stack)
    assert "C_global = T.sblock_alloc_buffer" in text and "T.vectorized(8)" in text
    assert ("T.parallel" in text) == (n * k > 100_000)
    a, b = np.random.rand(1, k).astype("float32"), np.random.rand(k, n).astype("float32")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    out = tvm.runtime.tensor(np.zeros((1, n), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-4)


def test_a_kernel_whose_schedule_does_not_lower_gets_the_next_schedule():
    # ShuffleNet V2's plan fusing a downsampling unit: its register-tiled schedule fails in
    # TIR's FlattenBuffer ("T_concat_intermediate is used before its definition"), so every
    # plan holding that group was a build_error; the build now falls back kernel by kernel
    from pathlib import Path

    from tvm import relax
    from tvm.script import from_source

    prim = from_source((Path(__file__).parent / "shuffle_unit_kernel.py").read_text())
    shapes = [tuple(int(d) for d in p.shape) for p in prim.params]
    bb = relax.BlockBuilder()
    ins = [relax.Var(f"a{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes[:-2])]
    with bb.function("main", ins):
        with bb.dataflow():
            gv = bb.add_func(prim, "fused_shuffle_unit")
            outs = [relax.TensorType(s, "float32") for s in shapes[-2:]]
            out = bb.emit_output(relax.call_tir(gv, relax.Tuple(ins), outs))
        bb.emit_func_output(out)
    fused, target = bb.get(), build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    # today's rules schedule this kernel in a way that lowers; the schedule that did not is kept
    text = (Path(__file__).parent / "shuffle_unit_scheduled.py").read_text()
    failing = from_source(text, check_well_formed=False)  # as printed: the bad buffer use is the point
    scheduled.update_func(scheduled.get_global_var("fused_shuffle_unit"), failing)
    with pytest.raises(Exception, match="used before its definition"):
        build.compile_scheduled(scheduled, target)
    ex, repaired = build.compile_repairing(fused, scheduled, target)
    assert SCHEDULED_ATTR in repaired["fused_shuffle_unit"].attrs
    feeds = [np.random.default_rng(k).standard_normal(s).astype("float32") for k, s in enumerate(shapes[:-2])]
    want = build.run(build.build(fused, target, "none"), tvm.cpu(), feeds)
    for got, ref in zip(build.run(ex, tvm.cpu(), feeds), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_pass_leaves_its_input_alone(transformer):
    fused = apply.apply_plan(transformer.mod, transformer.graph, transformer.tvm_default())
    before = fused.script()
    out = ScheduleCPU()(fused)
    assert fused.script() == before
    scheduled = [f for f in out.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and SCHEDULED_ATTR in f.attrs]
    assert len(scheduled) >= 10


@pytest.mark.parametrize("name", ["transformer", "conv_block", "mlp"])
def test_every_scheduler_gives_the_same_numbers(name, request):
    w = request.getfixturevalue(name)
    plan = SearchSpace(w.graph).plan_of_kinds({"vertical", "horizontal", "reduction"})
    fused = apply.apply_plan(w.mod, w.graph, plan)
    target = build.make_target("llvm")
    feeds = random_inputs(w.inputs)
    outs = [build.run(build.build(fused, target, s), tvm.cpu(), feeds)[0] for s in ("none", "rules")]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-5)


def test_unknown_scheduler_is_an_error(mlp):
    fused = apply.apply_plan(mlp.mod, mlp.graph, mlp.tvm_default())
    with pytest.raises(ValueError, match="unknown scheduler"):
        build.schedule(fused, build.make_target("llvm"), "fastest")


def _softmax_layer_norm(rows, width, axis=1):
    """softmax(x) + x, then layer norm, over `axis` of a (rows, width) input: the reductions
    and broadcasts of a fused reduction -> broadcast group."""
    from tvm import te

    n = (rows, width)[axis]
    x = te.placeholder((rows, width), "float32", name="x")

    def red(fn, name):
        k = te.reduce_axis((0, n), name=f"k_{name}")
        if axis == 1:
            return te.compute((rows,), lambda i: fn(lambda j: j, i, k), name=name)
        return te.compute((width,), lambda j: fn(lambda i: i, j, k), name=name)

    def at(t, i, j):  # t's value at (i, j), reduced vectors indexed by the kept axis
        return t[i] if axis == 1 else t[j]

    m = red(lambda _, i, k: te.max(x[i, k] if axis == 1 else x[k, i], axis=k), "m")
    e = te.compute(x.shape, lambda i, j: te.exp(x[i, j] - at(m, i, j)), name="e")
    s = red(lambda _, i, k: te.sum(e[i, k] if axis == 1 else e[k, i], axis=k), "s")
    y = te.compute(x.shape, lambda i, j: e[i, j] / at(s, i, j) + x[i, j], name="y")
    mu = red(lambda _, i, k: te.sum(y[i, k] if axis == 1 else y[k, i], axis=k), "mu")
    d = te.compute(x.shape, lambda i, j: y[i, j] - at(mu, i, j) / n, name="d")
    v = red(lambda _, i, k: te.sum(d[i, k] * d[i, k] if axis == 1 else d[k, i] * d[k, i], axis=k), "v")
    out = te.compute(x.shape, lambda i, j: d[i, j] / te.sqrt(at(v, i, j) / n + 1e-5), name="out")

    def reference(a):
        e_ = np.exp(a - a.max(axis, keepdims=True))
        y_ = e_ / e_.sum(axis, keepdims=True) + a
        d_ = y_ - y_.mean(axis, keepdims=True)
        return d_ / np.sqrt((d_ * d_).mean(axis, keepdims=True) + 1e-5)

    return te.create_prim_func([x, out]), reference


def test_row_reductions_and_broadcasts_run_one_row_at_a_time():
    from tvm import s_tir

    func, reference = _softmax_layer_norm(64, 256)
    scheduled = schedule_cpu(func, lanes=16)
    sch = s_tir.Schedule(scheduled)
    nests = {sch.get(sch.get_loops(b)[0]) for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert len(nests) == 1  # every stage inside one row loop
    text = scheduled.script()
    # each of the four reductions accumulates 16 lanes of partial results, vectorised, and sums
    # them pairwise (16 -> 8 -> 4 -> 2) rather than in a chain of 16
    for width in (16, 8, 4, 2):
        assert text.count(f"T.vectorized({width})") >= 4
    assert text.count("_rf_update") == 16
    assert text.count("T.exp(") == 1  # exp read by two stages is computed once per row
    a = np.random.default_rng(0).standard_normal((64, 256)).astype("float32")
    np.testing.assert_allclose(_run(scheduled, a, out_shape=(64, 256)), reference(a), rtol=1e-4, atol=1e-4)


def test_reduction_over_an_outer_axis_is_not_forced_into_rows():
    # rows here would recompute each column's reductions for every row: the row rule declines
    # and the kernel is still scheduled correctly
    from autofuse.schedule import _schedule_rows

    func, reference = _softmax_layer_norm(32, 64, axis=0)
    assert _schedule_rows(func, 16, 16) is None
    scheduled = schedule_cpu(func, lanes=16)
    a = np.random.default_rng(1).standard_normal((32, 64)).astype("float32")
    np.testing.assert_allclose(_run(scheduled, a, out_shape=(32, 64)), reference(a), rtol=1e-4, atol=1e-4)


def test_short_unvectorisable_output_axis_goes_inside_the_reduction():
    # ViT's attention scores: 17 x 17 per head; no vector width divides 17, so the 17 outputs of
    # a row are accumulated side by side (i-k-j) instead of one dependent chain per output
    from tvm import s_tir

    func = schedule_cpu(_matmul(17, 17, 32), lanes=16)
    sch = s_tir.Schedule(func)
    loops = sch.get_loops(sch.get_sblock("C_update"))
    assert [int(sch.get(lp).extent) for lp in loops][-2:] == [32, 17]
    a, b = np.random.rand(17, 32).astype("float32"), np.random.rand(32, 17).astype("float32")
    np.testing.assert_allclose(_run(func, a, b, out_shape=(17, 17)), a @ b, rtol=1e-5, atol=1e-5)


def _softmax(shape):
    """A module computing softmax over the last axis of one `shape` input."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.softmax(x, axis=-1))
        bb.emit_func_output(y)
    return bb.get()


def _attention(heads, tokens, dim=32):
    """Attention as torch exports it: (Q K^T) softmax, NaNs zeroed, times V."""
    from tvm import relax

    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, heads, tokens, dim), "float32"))
    kt = relax.Var("kt", relax.TensorType((1, heads, dim, tokens), "float32"))
    v = relax.Var("v", relax.TensorType((1, heads, tokens, dim), "float32"))
    with bb.function("main", [q, kt, v]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(q, kt)), axis=-1))
            p = bb.emit(relax.op.where(bb.emit(relax.op.isnan(p)), relax.const(0.0, "float32"), p))
            out = bb.emit_output(relax.op.matmul(p, v))
        bb.emit_func_output(out)
    return bb.get()


def _odd_kernels():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class LayerNormResidual:
        @R.function
        def main(x: R.Tensor((1, 50, 768), "float32"), r: R.Tensor((1, 50, 768), "float32"),
                 g: R.Tensor((768,), "float32"), b: R.Tensor((768,), "float32")) -> R.Tensor((1, 50, 768), "float32"):
            with R.dataflow():
                s = R.add(x, r)
                y = R.nn.layer_norm(s, g, b, axes=[-1])
                R.output(y)
            return y

    @I.ir_module
    class LayerNormThenReshape:  # BERT: the layer norm is kept (residual) and reshaped for a matmul
        @R.function
        def main(x: R.Tensor((1, 32, 128), "float32"), g: R.Tensor((128,), "float32"),
                 b: R.Tensor((128,), "float32")) -> R.Tuple(R.Tensor((1, 32, 128), "float32"), R.Tensor((32, 128), "float32")):
            with R.dataflow():
                y = R.nn.layer_norm(x, g, b, axes=[-1])
                z = R.reshape(y, (32, 128))
                out = (y, z)
                R.output(out)
            return out

    @I.ir_module
    class ScalarSumAndArgmax:  # a reduction to a scalar, and one that rfactor cannot split
        @R.function
        def main(x: R.Tensor((64, 100), "float32")) -> R.Tuple(R.Tensor((), "float32"), R.Tensor((64,), "int64")):
            with R.dataflow():
                s = R.sum(x)
                a = R.argmax(x, axis=-1)
                out = (s, a)
                R.output(out)
            return out

    @I.ir_module
    class ChannelsLastMean:  # a reduction over outer axes (image rows and columns), then a broadcast
        @R.function
        def main(x: R.Tensor((1, 7, 7, 64), "float32")) -> R.Tensor((1, 7, 7, 64), "float32"):
            with R.dataflow():
                m = R.mean(x, axis=[1, 2], keepdims=True)
                y = R.subtract(x, m)
                z = R.multiply(y, y)
                R.output(z)
            return z

    @I.ir_module
    class HalfSoftmax:
        @R.function
        def main(x: R.Tensor((16, 256), "float16")) -> R.Tensor((16, 256), "float16"):
            with R.dataflow():
                y = R.nn.softmax(x, axis=-1)
                z = R.multiply(y, x)
                R.output(z)
            return z

    @I.ir_module
    class MeanNoKeepdims:
        @R.function
        def main(x: R.Tensor((32, 48), "float32")) -> R.Tensor((32, 48), "float32"):
            with R.dataflow():
                m = R.mean(x, axis=[-1])
                d = R.subtract(x, R.expand_dims(m, -1))
                v = R.mean(R.multiply(d, d), axis=[-1], keepdims=True)
                y = R.divide(d, R.sqrt(R.add(v, R.const(1e-5, "float32"))))
                R.output(y)
            return y

    @I.ir_module
    class WindowReverse:  # Swin: a projection whose epilogue permutes rows across GEMM tiles
        @R.function
        def main(x: R.Tensor((64, 64), "float32"), w: R.Tensor((64, 64), "float32"),
                 b: R.Tensor((64,), "float32")) -> R.Tensor((1, 64, 64), "float32"):
            with R.dataflow():
                y = R.add(R.matmul(x, w), b)
                z = R.reshape(R.permute_dims(R.reshape(y, (1, 2, 4, 2, 4, 64)), [0, 1, 3, 2, 4, 5]), (1, 64, 64))
                R.output(z)
            return z

    @I.ir_module
    class GroupedConv:  # RegNet: 3x3 convolution in groups of 8 channels, stride 2
        @R.function
        def main(x: R.Tensor((1, 16, 32, 32), "float32"), w: R.Tensor((16, 8, 3, 3), "float32")) -> R.Tensor((1, 16, 16, 16), "float32"):
            with R.dataflow():
                y = R.nn.relu(R.nn.conv2d(x, w, strides=2, padding=1, groups=2))
                R.output(y)
            return y

    @I.ir_module
    class Conv3d:  # NCDHW stays as it is: register tiles over fused 10-pixel image rows
        @R.function
        def main(x: R.Tensor((1, 3, 4, 10, 10), "float32"), w: R.Tensor((8, 3, 1, 3, 3), "float32")) -> R.Tensor((1, 8, 4, 10, 10), "float32"):
            with R.dataflow():
                y = R.nn.conv3d(x, w, padding=[0, 1, 1, 0, 1, 1])
                R.output(y)
            return y

    @I.ir_module
    class TransposedConv:  # NCHW, 6-pixel rows, padded on one side (ONNX's SAME_UPPER)
        @R.function
        def main(x: R.Tensor((1, 1, 3, 3), "float32"), w: R.Tensor((1, 2, 3, 3), "float32")) -> R.Tensor((1, 2, 6, 6), "float32"):
            with R.dataflow():
                y = R.nn.conv2d_transpose(x, w, strides=2, padding=[0, 0, 1, 1])
                R.output(y)
            return y

    return {"grouped_conv": GroupedConv, "window_reverse": WindowReverse,
            # a column tile over fused image rows straddled two rows (conv3d: 4 of 10 pixels) and
            # its write-back covered both whole: outputs off by up to 19
            "conv3d": Conv3d, "transposed_conv": TransposedConv,
            "softmax197": _softmax((1, 4, 197, 197)),  # a prime row length, four heads
            "one_vector_rows": _softmax((8, 16)),  # a row exactly one vector long: nothing to split off
            "attention": _attention(4, 32), "attention17": _attention(4, 17),  # ViT's 17 tokens
            "attention_one_head17": _attention(1, 17),  # 17 rows: no row tile divides them
            "layer_norm": LayerNormResidual, "layer_norm_reshape": LayerNormThenReshape, "scalar_argmax": ScalarSumAndArgmax,
            "channels_last_mean": ChannelsLastMean, "half_softmax": HalfSoftmax, "mean_no_keepdims": MeanNoKeepdims}


@pytest.mark.parametrize("case", sorted(_odd_kernels()))
def test_odd_kernels_schedule_to_the_same_numbers(case):
    # shapes, reductions and epilogues the rules must handle or decline: every plan, scheduled,
    # gives the unscheduled loop nests' numbers
    from autofuse.workload import prepare

    w = prepare(_odd_kernels()[case])
    target = build.make_target("llvm")
    feeds = random_inputs(w.inputs)
    space = SearchSpace(w.graph)
    for plan in (w.tvm_default(), space.plan_of_kinds({"vertical", "horizontal", "reduction"})):
        fused = apply.apply_plan(w.mod, w.graph, plan)
        for name, func in fused.functions.items():  # every kernel gets a schedule (none fell back)
            if isinstance(func, tvm.tirx.PrimFunc) and name.name_hint.startswith(("fused_", "fast_softmax")):
                assert schedule_cpu(func, lanes=16) is not None, name
        want, got = (build.run(build.build(fused, target, s), tvm.cpu(), feeds) for s in ("none", "rules"))
        for a, b in zip(got, want):
            tol = 2e-2 if a.dtype == np.float16 else 1e-4
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_a_concatenation_after_a_tiled_convolution_is_not_computed_in_its_tiles():
    """YOLOv8's block: 1x1 conv -> SiLU (kept) -> 3x3 stride-2 conv -> SiLU -> concat with
    another tensor, fused into one kernel. Attached to the second convolution's tiles, the
    concatenation wrote only the channels a tile computes, the other tensor's never (garbage
    channels, caught as a wrong result by the tuner's check)."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    from autofuse.plan import FusionPlan
    from autofuse.workload import prepare

    @I.ir_module
    class Block:
        @R.function
        def main(x: R.Tensor((1, 32, 20, 20), "float32"), w1: R.Tensor((32, 32, 1, 1), "float32"),
                 w2: R.Tensor((32, 32, 3, 3), "float32"), z: R.Tensor((1, 64, 10, 10), "float32")):
            with R.dataflow():
                c1 = R.nn.conv2d(x, w1)
                s1 = R.multiply(c1, R.sigmoid(c1))
                c2 = R.nn.conv2d(s1, w2, strides=2, padding=1)
                y = R.concat([R.multiply(c2, R.sigmoid(c2)), z], axis=1)
                out = (s1, y)
                R.output(out)
            return out

    w = prepare(Block)
    body = tuple(n.id for n in w.graph.nodes if "transpose" not in n.op)
    rest = [(n.id,) for n in w.graph.nodes if "transpose" in n.op]
    plan = FusionPlan.from_groups([body, *rest], "block")
    fused = apply.apply_plan(w.mod, w.graph, plan)
    feeds = random_inputs(w.inputs)
    target = build.make_target("llvm")
    want, got = (build.run(build.build(fused, target, s), tvm.cpu(), feeds) for s in ("none", "rules"))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_grouped_convolution_vectorises_within_a_group():
    # 16 output channels in groups of 8: a 16-lane vector would gather input channels from two
    # groups; 8 lanes read one broadcast input value each
    from autofuse.workload import prepare

    w = prepare(_odd_kernels()["grouped_conv"])
    fused, kernels = apply.fuse(w.mod, w.graph, w.tvm_default())
    name = next(k for k in kernels if "conv2d" in k)
    text = schedule_cpu(fused[name], lanes=16).script()
    lines = text.splitlines()
    update = next(i for i, line in enumerate(lines) if 'T.sblock("group_conv2d_nhwc_update")' in line)
    assert _register_tiled(text) and "T.vectorized(T.int64(8))" in lines[update - 1], lines[update - 1]


def test_attention_runs_as_one_row_kernel_with_register_accumulators():
    # matmul -> softmax -> matmul fused: every stage inside one row loop, four rows at a time;
    # each matmul stage keeps 4 rows x 2 vectors of output in registers across its reduction
    from tvm import s_tir

    from autofuse.workload import prepare

    w = prepare(_attention(4, 32))
    plan = SearchSpace(w.graph).plan_of_kinds({"vertical"})
    assert len(plan.groups) == 1
    fused, kernels = apply.fuse(w.mod, w.graph, plan)
    scheduled = schedule_cpu(fused[kernels[0]], lanes=16)
    sch = s_tir.Schedule(scheduled)
    nests = {sch.get(sch.get_loops(b)[0]) for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert len(nests) == 1
    text = scheduled.script()
    assert "T.parallel(T.int64(32))" in text  # 128 rows in tiles of 4
    assert text.count("T.unroll(T.int64(4))") >= 2 and text.count("T.unroll(T.int64(2))") >= 2
    assert "T.isnan" not in text  # a bit test (normalize), which vectorises
    feeds = random_inputs(w.inputs)
    q, kt, v = feeds
    s_ = q @ kt
    e = np.exp(s_ - s_.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    got = build.run(build.build(fused, build.make_target("llvm")), tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_attention_rows_do_not_straddle_heads():
    # 17 tokens per head: no row tile divides them, so rows go one (head, token) at a time; a
    # tile across two heads made compute_at cover both heads whole (one row loop per head)
    from autofuse.workload import prepare

    w = prepare(_attention(4, 17))
    fused, kernels = apply.fuse(w.mod, w.graph, SearchSpace(w.graph).plan_of_kinds({"vertical"}))
    assert len(kernels) == 1
    assert "T.parallel(T.int64(68))" in schedule_cpu(fused[kernels[0]], lanes=16).script()


def test_arithmetic_before_a_matmul_is_computed_once_not_per_output():
    # x -> tanh -> reshape -> matmul in one kernel: tanh inlined into the GEMM would run once
    # per (element, output column); it stays a stage of its own, the reshape inlines
    from tvm import relax
    from tvm import s_tir

    from autofuse.workload import prepare

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 64), "float32"))
    wt = relax.Var("w", relax.TensorType((64, 48), "float32"))
    with bb.function("main", [x, wt]):
        with bb.dataflow():
            h = bb.emit(relax.op.reshape(bb.emit(relax.op.tanh(x)), (32, 64)))
            out = bb.emit_output(relax.op.matmul(h, wt))
        bb.emit_func_output(out)
    w = prepare(bb.get())
    plan = SearchSpace(w.graph).plan_of_kinds({"vertical"})
    assert len(plan.groups) == 1
    fused, kernels = apply.fuse(w.mod, w.graph, plan)
    scheduled = schedule_cpu(fused[kernels[0]], lanes=16)
    sch = s_tir.Schedule(scheduled)
    stages = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert any("tanh" in n for n in stages) and not any("reshape" in n for n in stages), stages
    feeds = random_inputs(w.inputs)
    got = build.run(build.build(fused, build.make_target("llvm")), tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, np.tanh(feeds[0]).reshape(32, 64) @ feeds[1], rtol=1e-4, atol=1e-4)


def test_row_kernel_keeps_a_trailing_reshape_out_of_its_rows():
    # a layer norm that is an output and also reshaped: the reshape's index arithmetic hid from
    # compute_at that a row needs one row, so the row rule declined and every reduction ran as
    # one scalar chain (3.6 us against 0.4 us in BERT); the reshape now stays a nest of its own
    from tvm import s_tir

    from autofuse.schedule import _schedule_rows
    from autofuse.workload import prepare

    w = prepare(_odd_kernels()["layer_norm_reshape"])
    fused = apply.apply_plan(w.mod, w.graph, SearchSpace(w.graph).plan_of_kinds({"vertical", "reduction"}))
    [func] = [f for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc) and "reshape" in gv.name_hint]
    scheduled = _schedule_rows(func, 16, 16)
    assert scheduled is not None
    sch = s_tir.Schedule(scheduled)
    nests = [sch.get(sch.get_loops(b)[0]) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert len({n for n in nests}) == 2  # the rows, then the reshape
    assert scheduled.script().count("_rf_update") == 8  # both reductions as vectorised partials


def _matmul_module(weight_as_input: bool, m=6, k=96, n=64, calls=1):
    """relu(x[m, k] @ W[k, n]) with W a constant (as ONNX import binds weights) or a second
    input; `calls` > 1 (with k == n): applied that many times in turn, with the same W."""
    from tvm import relax

    w = np.random.default_rng(1).standard_normal((k, n)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    params = [x]
    if weight_as_input:
        params.append(relax.Var("w", relax.TensorType((k, n), "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            weight = params[1] if weight_as_input else relax.const(w)
            out = x
            for _ in range(calls):
                out = bb.emit(relax.op.nn.relu(relax.op.matmul(out, weight)))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    from autofuse.workload import prepare

    wl = prepare(bb.get())
    return wl, apply.apply_plan(wl.mod, wl.graph, wl.tvm_default()), w


def _kernel(mod):
    from tvm import tirx

    return next((gv.name_hint, f) for gv, f in mod.functions.items()
                if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint)


def test_constant_weights_are_repacked_once_in_tile_order():
    # a register tile read its weights one cache line per reduction step, a row of W apart;
    # re-laid as [n / tile, k, tile] panels it streams them (MobileNetV2's 160 -> 1280 1x1
    # convolution with cold caches: 165 -> 82 us). The constants are re-laid at compile time.
    from autofuse.schedule import PACKED_ATTR
    from autofuse.schedule import pack_constants

    wl, fused, w = _matmul_module(weight_as_input=False)
    target = build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    name, kernel = _kernel(scheduled)
    tile = int(kernel.params[1].shape[-1])
    lanes = vector_bits(target) // 32  # a tile is 1 or 2 vectors wide over 64 columns
    assert [int(d) for d in kernel.params[1].shape] == [64 // tile, 96, tile] and tile in (lanes, 2 * lanes)
    assert [[int(v) for v in p] for p in kernel.attrs[PACKED_ATTR]] == [[1, tile]]
    weight = _constant_args(pack_constants(scheduled), name)
    np.testing.assert_array_equal(weight, w.reshape(96, 64 // tile, tile).transpose(1, 0, 2))
    feeds = random_inputs(wl.inputs)
    got = build.run(build.compile_scheduled(scheduled, target)[0], tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, np.maximum(feeds[0] @ w, 0), rtol=1e-5, atol=1e-5)
    # the public pass leaves a module ready to lower, with its constants re-laid
    with target:
        ready = ScheduleCPU(vector_bits(target))(fused)
    assert _constant_args(ready, name).shape == (64 // tile, 96, tile)
    # packing again (build's lowering packs whatever it is given) leaves the module as it is
    got = build.run(build.compile_scheduled(ready, target)[0], tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, np.maximum(feeds[0] @ w, 0), rtol=1e-5, atol=1e-5)
    # a kernel swapped for another of its schedules (build's repair) keeps the weights' layout
    plain = scheduled.clone()
    plain[name] = schedule_cpu(fused[name], 8, 12)
    got = build.run(build.compile_scheduled(plain, target)[0], tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, np.maximum(feeds[0] @ w, 0), rtol=1e-5, atol=1e-5)


def _constant_args(mod, kernel):
    from autofuse.tvm_bridge import main_block

    call = next(b.value for b in main_block(mod).node_bindings if b.value.args[0].name_hint == kernel)
    return call.args[1].fields[1].value.numpy()


def test_weights_passed_as_inputs_keep_their_layout():
    # re-laid at run time on every call, a weight input would cost more than it saves
    from autofuse.schedule import PACKED_ATTR

    wl, fused, w = _matmul_module(weight_as_input=True)
    target = build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    _, kernel = _kernel(scheduled)
    assert _register_tiled(kernel.script()) and PACKED_ATTR not in (kernel.attrs or {})
    assert [int(d) for d in kernel.params[1].shape] == [96, 64]
    feeds = random_inputs(wl.inputs)
    got = build.run(build.compile_scheduled(scheduled, target)[0], tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, np.maximum(feeds[0] @ feeds[1], 0), rtol=1e-5, atol=1e-5)


def test_channels_last_pooling_is_not_a_row_kernel():
    # its window reduces across the image, not along the innermost (channel) axis: as a row
    # kernel ResNet's 3x3 max pool ran the window outermost over the whole output (63 -> 40 us)
    from tvm import relax

    from autofuse.schedule import _schedule_rows
    from autofuse.workload import prepare

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 32, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1, layout="NHWC"))
        bb.emit_func_output(out)
    w = prepare(bb.get())
    fused = apply.apply_plan(w.mod, w.graph, w.tvm_default())
    pools = [f for gv, f in fused.functions.items() if "pool" in gv.name_hint]
    assert pools and all(_schedule_rows(f, 8, 12) is None for f in pools)
    # the window outside a group of output vectors, unrolled (48 -> 3 us): 32 channels, 4 vectors
    assert all(_update_loops(schedule_cpu(f, lanes=8))[-4:] == [(3, ""), (3, ""), (4, "unroll"), (8, "vectorized")]
               for f in pools)
    target = build.make_target("llvm")
    feeds = random_inputs(w.inputs)
    want, got = (build.run(build.build(fused, target, s), tvm.cpu(), feeds) for s in ("none", "rules"))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def _update_loops(func):
    """(extent, annotation) of the loops around a scheduled reduction's update block."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    block = next(b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.endswith("_update"))
    kinds = {0: "", 1: "parallel", 2: "vectorized", 3: "unroll"}
    return [(int(sch.get(lp).extent), kinds.get(int(sch.get(lp).kind), "?")) for lp in sch.get_loops(block)]


@pytest.mark.parametrize("rows, cols, group", [(512, 1024, 8), (40, 96, 12), (7, 24, 3)])
def test_column_sum_accumulates_a_group_of_output_vectors_in_registers(rows, cols, group):
    # a reduction across rows, contiguous along its output: had been a serial dot product down
    # each column (512x1024: 1.2 ms; 30-41 us now); the group is the largest divisor of the
    # output's vectors within the accumulator budget, the row loop between groups and vectors
    from tvm import te

    x = te.placeholder((rows, cols), name="x")
    r = te.reduce_axis((0, rows), name="r")
    y = te.compute((cols,), lambda c: te.sum(x[r, c], axis=r), name="y")
    func = schedule_cpu(te.create_prim_func([x, y]), lanes=8, acc=12)
    loops = _update_loops(func)
    assert loops[-3:] == [(rows, ""), (group, "unroll"), (8, "vectorized")]
    assert loops[0] == (cols // (8 * group), "parallel" if rows * cols >= 1 << 18 else "")
    a = np.random.default_rng(0).standard_normal((rows, cols)).astype("float32")
    np.testing.assert_allclose(_run(func, a, out_shape=(cols,)), a.sum(0), rtol=1e-4, atol=1e-4)


def _binding(func, block_name, axis):
    """The printed binding of a block's iterator `axis` (0-based) in a scheduled function."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    realize = sch.get(sch.get_loops(sch.get_sblock(block_name))[-1]).body
    return str(realize.iter_values[axis])


def test_the_l2_size_is_read_from_the_machine(tmp_path):
    from autofuse.schedule import _cache_bytes

    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                                 (2, "Unified", "1024K"), (3, "Unified", "32M")]):
        (tmp_path / f"index{index}").mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / f"index{index}" / name).write_text(f"{value}\n")
    assert _cache_bytes(tmp_path, 2) == 1 << 20
    assert _cache_bytes(tmp_path, 3) == 32 << 20
    assert _cache_bytes(tmp_path, 1) == 48 << 10  # the data cache, not the instruction cache
    assert _cache_bytes(tmp_path / "missing", 2) is None


@pytest.mark.parametrize("columns_outer", [True, False])
def test_weights_larger_than_l2_are_streamed_once(columns_outer):
    # 12 rows in two 6-row tiles: with more weights than this machine's L2 holds (1 MiB or more),
    # each row tile would stream them all from L3 or memory; the column tiles go outermost and
    # a panel serves both row tiles. 128 KiB stay in L2: rows outermost, as before (ViT's 128 x
    # 512 projections ran 1.1x slower otherwise)
    from autofuse.schedule import l2_bytes

    n = max(512, l2_bytes() // (512 * 4)) if columns_outer else 64
    func = schedule_cpu(_matmul(12, n, 512), lanes=8, acc=12)
    rows, cols = _binding(func, "C_update", 0), _binding(func, "C_update", 1)
    assert ("//" in cols and "%" in rows) == columns_outer
    _run_matmul(func, 12, n, 512)


@pytest.mark.parametrize("l2_kib", [256, 64 << 10])
def test_weights_larger_than_l2_meeting_more_rows_go_in_blocks_of_columns(l2_kib, monkeypatch):
    # 512 KiB of weights against 600 KiB of rows: with a 256 KiB L2 neither order of whole loops
    # keeps anything in cache (rows outermost stream all the weights again for every row tile:
    # RetinaNet's 3x3 256 -> 256 convolution on 100x100 64 ms; 47 in blocks). Blocks of column
    # tiles whose panels fill half of L2 (256 columns x 128 x 4 bytes) go outermost, then the
    # rows, then the block's column tiles; with a 64 MiB L2 the rows stay outermost
    from autofuse import schedule

    monkeypatch.setattr(schedule, "l2_bytes", lambda: l2_kib << 10)
    func = schedule_cpu(_matmul(1200, 1024, 128), lanes=8, acc=12)
    rows, cols = _binding(func, "C_update", 0), _binding(func, "C_update", 1)
    blocked = l2_kib == 256
    assert ("//" in cols and "%" in cols and "* 256 +" in cols and "%" in rows) == blocked, (rows, cols)
    assert ("//" in rows and "//" not in cols) == (not blocked), (rows, cols)
    _run_matmul(func, 1200, 1024, 128)


def test_a_small_image_gives_the_register_tile_rows_from_all_its_rows():
    # a 1x1 convolution on a 2x2 channels-last image: two rows of one image row used 4 of the
    # 12 accumulators and streamed the weights once per image row (ResNeXt's 1024 -> 2048 one:
    # cold 709 -> 520 us); the tile now covers the 4 pixels
    from tvm import te

    x = te.placeholder((1, 2, 2, 64), name="x")
    w = te.placeholder((1, 1, 64, 128), name="w")
    r = te.reduce_axis((0, 64), name="ci")
    y = te.compute((1, 2, 2, 128), lambda b, h, v, c: te.sum(x[b, h, v, r] * w[0, 0, r, c], axis=r), name="y")
    func = schedule_cpu(te.create_prim_func([x, w, y]), lanes=8, acc=12)
    assert _update_loops(func)[-4:] == [(64, ""), (4, "unroll"), (2, "unroll"), (8, "vectorized")]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 2, 2, 64)).astype("float32"), rng.standard_normal((1, 1, 64, 128)).astype("float32")
    np.testing.assert_allclose(_run(func, a, b, out_shape=(1, 2, 2, 128)), np.einsum("bhwi,io->bhwo", a, b[0, 0]),
                               rtol=1e-4, atol=1e-4)


def test_register_tiles_are_three_vectors_wide_where_rows_are_broadcasts():
    # AVX2's 12 accumulators as 4 rows x 3 vectors (each step: 4 broadcasts and 3 loads feed 12
    # FMAs, against 4 and 2 for 8): GoogLeNet's 3x3 convolutions 1.2x faster. A depthwise
    # convolution loads a vector of input per row and column, and spilled at 3 vectors wide
    from tvm import te

    func = schedule_cpu(_matmul(16, 192, 64), lanes=8, acc=12)
    assert _update_loops(func)[-3:] == [(4, "unroll"), (3, "unroll"), (8, "vectorized")]
    _run_matmul(func, 16, 192, 64)

    x = te.placeholder((1, 10, 10, 96), name="x")
    w = te.placeholder((3, 3, 96), name="w")
    kh, kw = te.reduce_axis((0, 3), name="kh"), te.reduce_axis((0, 3), name="kw")
    y = te.compute((1, 8, 8, 96), lambda b, h, v, c: te.sum(x[b, h + kh, v + kw, c] * w[kh, kw, c], axis=[kh, kw]),
                   name="y")
    depthwise = schedule_cpu(te.create_prim_func([x, w, y]), lanes=8, acc=12)
    assert _update_loops(depthwise)[-2:] == [(2, "unroll"), (8, "vectorized")]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 10, 10, 96)).astype("float32"), rng.standard_normal((3, 3, 96)).astype("float32")
    want = sum(a[:, i:i + 8, j:j + 8, :] * b[i, j] for i in range(3) for j in range(3))
    np.testing.assert_allclose(_run(depthwise, a, b, out_shape=(1, 8, 8, 96)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c_in", [32, 3])
def test_a_partial_last_tile_of_merged_rows_overlaps_the_one_before_it(c_in):
    # a 7x7 image's 49 rows in 6-row tiles: the ninth tile was predicated, which put a predicate
    # on every row of every tile, and LLVM then kept the accumulators in memory unless it
    # versioned the loop (Xception's 1x1 728 -> 728 convolution on 37x37: 14.4 -> 7.0 ms). The
    # last tile now starts 6 rows before the end, computing 5 rows of the one before again;
    # a short reduction (3 input channels: 27 taps) keeps its predicate
    from tvm import te

    x, b, conv = _window(False, 7, 7, c_in=c_in, c_out=64)
    relu = te.compute((1, 7, 7, 64), lambda n, h, w, o: te.max(conv[n, h, w, o], 0.0), name="relu")
    func = schedule_cpu(te.create_prim_func([x, b, relu]), lanes=8, acc=12)
    text = func.script()
    assert (6, "unroll") in _update_loops(func)
    assert ("T.where" in text) == (c_in == 3) and (", 43)" in text) == (c_in == 32)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 9, 9, c_in)).astype("float32")
    w = rng.standard_normal((3, 3, c_in, 64)).astype("float32")
    want = np.maximum(sum(a[:, i:i + 7, j:j + 7, :] @ w[i, j] for i in range(3) for j in range(3)), 0)
    np.testing.assert_allclose(_run(func, a, w, out_shape=(1, 7, 7, 64)), want, rtol=1e-4, atol=1e-4)


def test_image_rows_straddled_by_a_tile_are_merged_in_layout_too():
    # 5 x 2 rows against 16 columns: fused as loops into 10 rows, a 5-row tile straddled two of
    # the outer rows, and its write-back covered both, outputs it never computed included (an
    # LSTM's input projection gave wrong results); the accumulator is now laid out by merged
    # row, so the write-back covers exactly the tile's rows
    from tvm import te

    x = te.placeholder((5, 2, 3), name="x")
    b = te.placeholder((3, 16), name="B")
    r = te.reduce_axis((0, 3), name="k")
    y = te.compute((5, 2, 16), lambda i, t, j: te.sum(x[i, t, r] * b[r, j], axis=r), name="y")
    func = schedule_cpu(te.create_prim_func([x, b, y]), lanes=8, acc=12)
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((5, 2, 3)).astype("float32"), rng.standard_normal((3, 16)).astype("float32")
    np.testing.assert_allclose(_run(func, a, w, out_shape=(5, 2, 16)), a @ w, rtol=1e-5, atol=1e-5)


def test_image_rows_a_tile_divides_are_not_merged_for_a_slightly_better_tile():
    # 21-pixel image rows in 7x2 tiles; merged, the 441 pixels would take 9x2 tiles, 5% more FMAs
    # per load on paper, but re-laid across image rows: Inception-v3's 147-pixel rows so ran
    # 0.88x (3x3, 32 -> 64 channels), and 31 such kernels of seven timm CNNs 0.98-1.74x unmerged
    prim, check = _window_conv(False, 21, 21, c_out=64)
    func = schedule_cpu(prim, lanes=16, acc=24)
    assert (7, "unroll") in _update_loops(func) and "441" not in func.script()
    check(func)


def test_an_rgb_stem_keeps_its_image_rows_for_a_slightly_better_tile():
    # Inception-v3's stem: 3x3x3 stride 2 into 149x149x32. 149 pixels take a padded 12-row tile;
    # merged, the 22,201 take 12-row tiles scoring 1.05x, but each tile straddling image rows
    # recomputes its windows' indices for only 27 multiply-adds a row: 466 -> 206 us unmerged
    prim, check = _window_conv(False, 149, 149, c_in=3, stride=2)
    func = schedule_cpu(prim, lanes=16, acc=24)
    assert "22201" not in func.script()
    check(func)


def test_a_7x7_convolution_tiles_its_49_rows_across_image_rows_with_its_epilogue():
    # a 7-pixel image row took 7x1 tiles (7 broadcasts per 7 FMAs); merged, the 49 pixels take
    # 6x2 tiles straddling image rows (ResNet-50's 7x7 and 14x14 convolutions 1.37x faster).
    # The epilogue is re-laid too, and computed per tile: a box around straddling rows in the
    # image's dimensions would cover outputs the tile has not computed
    from tvm import te

    x, b, conv = _window(False, 7, 7, c_out=64)
    relu = te.compute((1, 7, 7, 64), lambda n, h, w, o: te.max(conv[n, h, w, o], 0.0), name="relu")
    func = schedule_cpu(te.create_prim_func([x, b, relu]), lanes=8, acc=12)
    assert (6, "unroll") in _update_loops(func)
    assert "49, 64)" in func.script()  # the intermediate: one axis of rows over the whole image
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    tile = sch.get_loops(sch.get_sblock("conv_update"))[0]
    assert sch.get(sch.get_loops(sch.get_sblock("relu"))[0]).same_as(sch.get(tile))  # the epilogue inside the tile
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((1, 9, 9, 32)).astype("float32"), rng.standard_normal((3, 3, 32, 64)).astype("float32")
    want = np.maximum(sum(a[:, i:i + 7, j:j + 7, :] @ w[i, j] for i in range(3) for j in range(3)), 0)
    np.testing.assert_allclose(_run(func, a, w, out_shape=(1, 7, 7, 64)), want, rtol=1e-4, atol=1e-4)


def test_a_depthwise_convolutions_padding_is_inlined_a_convolutions_is_not():
    # a depthwise convolution reads its input as vectors along the channels, like a pooling
    # window: its padding's test is uniform across the lanes, and as a copy of its own it
    # doubled the traffic of a memory-bound kernel. A convolution reads one input value per
    # row of outputs, a broadcast: inlined, the test sat in its innermost loop; so does a
    # grouped one whose groups span a tile of two vectors (ResNeSt's 2-group convolutions ran
    # at half speed), not one of narrower groups (each vector reads several input channels)
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 14, 14), "float32"))
    rng = np.random.default_rng(0)
    dw, two, four = (relax.const(rng.standard_normal((32, c, 3, 3)).astype("float32")) for c in (1, 16, 8))
    full = relax.const(np.random.default_rng(1).standard_normal((16, 32, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, dw, padding=1, groups=32))
            y = bb.emit(relax.op.nn.conv2d(y, two, padding=1, groups=2))
            y = bb.emit(relax.op.nn.conv2d(y, four, padding=1, groups=4))
            out = bb.emit_output(relax.op.nn.conv2d(y, full, padding=1))
        bb.emit_func_output(out)
    from autofuse.workload import prepare

    w = prepare(bb.get())
    fused = apply.apply_plan(w.mod, w.graph, w.unfused())
    convs = {gv.name_hint: f for gv, f in fused.functions.items() if "conv2d" in gv.name_hint}
    assert len(convs) == 4
    padded = {int(f.params[1].shape[-2]): 'sblock("pad_temp")' in schedule_cpu(f, lanes=8, acc=12).script()
              for f in convs.values()}  # by the weights' input channels per group (HWIO): 1 for the depthwise one
    assert padded == {1: False, 16: True, 8: False, 32: True}
    target = build.make_target("llvm")
    feeds = random_inputs(w.inputs)
    want, got = (build.run(build.build(fused, target, s), tvm.cpu(), feeds) for s in ("none", "rules"))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_a_tiles_intermediate_is_local_to_the_tile_a_shared_one_is_not():
    # the copy of a register tile's accumulator that its epilogue reads lives inside the tile:
    # in global scope it was allocated from the runtime's workspace pool at every tile once
    # it reached 1 KiB (AVX-512's 8x2 tiles; ResNet-50's 56x56 1x1 convolution + add 1.15x
    # faster without). A padded input, written by all tiles' loop nest first, stays global
    from tvm import te

    x = te.placeholder((1, 8, 8, 32), name="x")
    b = te.placeholder((3, 3, 32, 64), name="B")
    pad = te.compute((1, 10, 10, 32), lambda n, h, w, c: te.if_then_else(
        te.all(h >= 1, h < 9, w >= 1, w < 9), x[n, h - 1, w - 1, c], 0.0), name="pad")
    ry, rx, rc = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx"), te.reduce_axis((0, 32), "rc")
    conv = te.compute((1, 8, 8, 64), lambda n, h, w, o: te.sum(pad[n, h + ry, w + rx, rc] * b[ry, rx, rc, o],
                                                               axis=[ry, rx, rc]), name="conv")
    relu = te.compute((1, 8, 8, 64), lambda n, h, w, o: te.max(conv[n, h, w, o], 0.0), name="relu")
    func = schedule_cpu(te.create_prim_func([x, b, relu]), lanes=16, acc=16)
    allocs = [line.strip() for line in func.script().splitlines() if "sblock_alloc_buffer" in line]
    assert [a.split(" =")[0] for a in allocs if 'scope="local"' not in a] == ["pad"]
    assert len(allocs) == 3  # pad, and the tile's accumulator and its copy, both local
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((1, 8, 8, 32)).astype("float32"), rng.standard_normal((3, 3, 32, 64)).astype("float32")
    p = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.maximum(sum(p[:, i:i + 8, j:j + 8, :] @ w[i, j] for i in range(3) for j in range(3)), 0)
    np.testing.assert_allclose(_run(func, a, w, out_shape=(1, 8, 8, 64)), want, rtol=1e-4, atol=1e-4)


def _padded_conv(side, cin, cout, k, stride, constant_weights=False):
    """x (NHWC) zero-padded by k // 2 (k an int, or (kh, kw)), then a k x k convolution at the
    stride, as topi writes it; with `constant_weights`, weights the schedule may re-lay
    (LAYOUT_FREE_ATTR), as ONNX import binds them."""
    from tvm import te

    from autofuse.schedule import LAYOUT_FREE_ATTR

    kh, kw = (k, k) if isinstance(k, int) else k
    ph, pw = kh // 2, kw // 2
    x = te.placeholder((1, side, side, cin), name="x")
    b = te.placeholder((kh, kw, cin, cout), name="B")
    pad = te.compute((1, side + 2 * ph, side + 2 * pw, cin), lambda n, h, w, c: te.if_then_else(
        te.all(h >= ph, h < side + ph, w >= pw, w < side + pw), x[n, h - ph, w - pw, c], 0.0), name="pad")
    out = (side + 2 * ph - kh) // stride + 1
    ry, rx, rc = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx"), te.reduce_axis((0, cin), "rc")
    conv = te.compute((1, out, out, cout), lambda n, h, w, o: te.sum(
        pad[n, h * stride + ry, w * stride + rx, rc] * b[ry, rx, rc, o], axis=[ry, rx, rc]), name="conv")
    prim = te.create_prim_func([x, b, conv])
    return (prim.with_attr(LAYOUT_FREE_ATTR, [1]) if constant_weights else prim), out


@pytest.mark.parametrize(("cin", "cout", "k", "in_tiles"), [
    (32, 32, 3, True),  # MobileNetV4's 3x3 stride-2 convolution: each window padded 1.5 times
    (3, 32, 3, True),  # a stem over RGB (MobileNetV2's, EfficientNet's)
    (3, 64, 7, False),  # ResNet's 7x7 stem: two channel tiles, wide windows: 9 times over
])
def test_a_strided_convolution_pads_its_input_tile_by_tile(cin, cout, k, in_tiles):
    # padding the whole image first wrote it to memory to read it back: MobileNetV4's
    # 112x112x32 stride-2 3x3 convolution 204 -> 189 us, stems over RGB 1.2-1.4x (alone). Per
    # tile, the rows and columns its outputs read are padded in L1, unless the windows overlap
    # so much that the copy is repeated more than PAD_REDUNDANCY times
    from tvm import s_tir

    prim, out = _padded_conv(32, cin, cout, k, 2)
    func = schedule_cpu(prim, lanes=16, acc=16)
    sch = s_tir.Schedule(func)
    pad_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("pad"))]
    tile_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("conv_update"))]
    assert any(lp.same_as(tile_loops[0]) for lp in pad_loops) == in_tiles
    extents = [int(lp.extent) for lp in pad_loops]
    if in_tiles:  # the window of one tile: k rows, and 2 * 8 + k - 2 columns for 8 outputs
        assert (k, 2 * 8 + k - 2) in zip(extents, extents[1:])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 32, 32, cin)).astype("float32")
    w = rng.standard_normal((k, k, cin, cout)).astype("float32")
    p = np.pad(a, ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
    want = sum(p[:, i:i + 2 * out:2, j:j + 2 * out:2, :] @ w[i, j] for i in range(k) for j in range(k))
    np.testing.assert_allclose(_run(func, a, w, out_shape=(1, out, out, cout)), want, rtol=1e-4, atol=1e-4)


def _copies_per_input(func):
    """How many blocks loop_partition made of a concatenation (one per input: `..._ax1_0`)."""
    return len([b for b in re.findall(r'T.sblock\("(\w+)"\)', func.script()) if re.search(r"_ax\d+_\d+$", b)])


@pytest.mark.parametrize("then", ["reshape", "transpose"])
def test_steps_stacked_along_time_are_copied_one_loop_per_step(then):
    # an LSTM's outputs, one per step, concatenated along time (an outer axis) and read
    # reshaped or transposed: inlined into that reader, every element tested every step's
    # bounds (Sequencer2D's 64-way stacking kernel 640 us a call); as a loop per step, each a
    # plain vectorised copy, 57 us
    from tvm import te
    from tvm import topi

    steps = [te.placeholder((1, 8, 32), name=f"h{t}") for t in range(6)]
    stacked = topi.concatenate(steps, axis=0)
    out = (topi.reshape(stacked, (48, 32)) if then == "reshape"
           else topi.reshape(topi.transpose(stacked, (1, 0, 2)), (8, 192)))
    func = schedule_cpu(te.create_prim_func([*steps, out]), lanes=16, acc=16)
    assert _copies_per_input(func) == 6
    rng = np.random.default_rng(0)
    hs = [rng.standard_normal((1, 8, 32)).astype("float32") for _ in steps]
    want = np.concatenate(hs, axis=0)
    want = want.reshape(48, 32) if then == "reshape" else want.transpose(1, 0, 2).reshape(8, 192)
    np.testing.assert_array_equal(_run(func, *hs, out_shape=want.shape), want)


def test_steps_of_both_directions_stacked_along_time_are_copied_one_loop_per_step():
    # a bidirectional LSTM's outputs at time t, each direction's picked from step t or 5 - t,
    # stacked along time, then transposed so that time is no longer outermost (Sequencer2D's
    # horizontal LSTM: its W axis). Each pick, inlined, reads its steps at index 0 along time
    # (no offset left to see), and a transpose whose swapped axes have equal extents reads like
    # a copy: both once let the stacking be inlined into the transpose, every element testing
    # every step (Sequencer2D's 284 us a call; as a loop per step 52)
    from tvm import te
    from tvm import topi

    steps = [te.placeholder((1, 2, 6, 32), name=f"h{t}") for t in range(6)]
    forward = te.placeholder((1, 2, 1, 1), name="forward", dtype="bool")
    picked = [topi.where(forward, steps[t], steps[5 - t]) for t in range(6)]
    out = topi.reshape(topi.transpose(topi.concatenate(picked, axis=0), (2, 0, 1, 3)), (6, 6, 64))
    func = schedule_cpu(te.create_prim_func([*steps, forward, out]), lanes=16, acc=16)
    assert _copies_per_input(func) == 6
    rng = np.random.default_rng(0)
    hs = [rng.standard_normal((1, 2, 6, 32)).astype("float32") for _ in steps]
    fwd = np.array([True, False]).reshape(1, 2, 1, 1)
    want = np.concatenate([np.where(fwd, hs[t], hs[5 - t]) for t in range(6)]).transpose(2, 0, 1, 3).reshape(6, 6, 64)
    np.testing.assert_array_equal(_run(func, *hs, fwd, out_shape=want.shape), want)


def test_a_channel_concatenation_with_an_input_read_transposed_is_copied_per_input():
    # RDNet joins a channels-last map and an NCHW one along the channels: only one input's
    # channel index is offset (the other's is not in its last axis), and it is still a
    # concatenation, copied one loop per input, not a padding
    from tvm import te

    a = te.placeholder((1, 8, 8, 64), name="a")
    b = te.placeholder((1, 64, 8, 8), name="b")
    out = te.compute((1, 8, 8, 128), lambda n, h, w, c: te.if_then_else(
        c >= 64, a[n, h, w, c - 64], b[n, c, h, w]), name="cat")
    func = schedule_cpu(te.create_prim_func([a, b, out]), lanes=16, acc=16)
    assert _copies_per_input(func) == 2
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((1, 8, 8, 64)).astype("float32"), rng.standard_normal((1, 64, 8, 8)).astype("float32")
    want = np.concatenate([y.transpose(0, 2, 3, 1), x], axis=-1)
    np.testing.assert_array_equal(_run(func, x, y, out_shape=(1, 8, 8, 128)), want)


@pytest.mark.parametrize("channels, parallel", [(2048, True), (64, False)])
def test_a_big_transpose_runs_in_parallel_though_it_does_not_vectorise(channels, parallel):
    # NHWC -> NCHW at a CNN's output: 7x7 positions innermost do not vectorise, and each element
    # costs about a vector's worth of an elementwise loop; ResNet-50's (100K elements) ran
    # serial, 104 -> 53 us on two threads. A small one stays serial (the pool's wake-up)
    from tvm import te

    x = te.placeholder((1, 7, 7, channels), name="x")
    y = te.compute((1, channels, 7, 7), lambda n, c, h, w: x[n, h, w, c], name="y")
    func = schedule_cpu(te.create_prim_func([x, y]), lanes=16, acc=16)
    assert ("T.parallel" in func.script()) == parallel
    a = np.random.default_rng(0).standard_normal((1, 7, 7, channels)).astype("float32")
    np.testing.assert_array_equal(_run(func, a, out_shape=(1, channels, 7, 7)), a.transpose(0, 3, 1, 2))


def _loops(func) -> list[str]:
    return [line.strip() for line in func.script().splitlines() if line.strip().startswith("for ")]


@pytest.mark.parametrize(("shape", "last_loops"), [
    ((1599, 64), [16, 16]),  # output rows no vector divides: scalar tiles, the last partial
    ((199, 100), [10, 16]),  # and 10 input rows a tile, which divide the 100
    ((64, 56), [14, 16]),  # whole vectors over tiles of 14 of the 56 input rows
    ((64, 53), [212, 16]),  # no such divisor: a partial tile would scalarise the vectors; none
    ((17, 128), [128, 17]),  # small enough for L1: plain loops
])
def test_a_transpose_no_vector_divides_still_runs_in_tiles(shape, last_loops):
    # an audio model's NWC -> NCW output (1599 frames) or ViT's 197 tokens: without whole vectors
    # each output row read one cache line per element, a row too long for L1 (1599 x 512:
    # 1279 -> 367 us in tiles of 16 x 16 scalars, the last ones partial); ConvNeXt's 56 image
    # columns in tiles of 14 (a predicated 16 had made its vectors scalar: 0.71x)
    from tvm import te

    rows, cols = shape
    x = te.placeholder((1, rows, cols), name="x")
    y = te.compute((1, cols, rows), lambda n, c, w: x[n, w, c], name="y")
    func = schedule_cpu(te.create_prim_func([x, y]), lanes=16, acc=16)
    extents = [int(e) for args in re.findall(r"\(([\d, ]+)\):$", "\n".join(_loops(func)), re.M) for e in args.split(",")]
    assert extents[-2:] == last_loops, _loops(func)
    assert ("T.vectorized" in func.script()) == (rows % 16 == 0)
    a = np.random.default_rng(0).standard_normal((1, rows, cols)).astype("float32")
    np.testing.assert_array_equal(_run(func, a, out_shape=(1, cols, rows)), a.transpose(0, 2, 1))


@pytest.mark.parametrize("case", ["key_heads", "nchw_to_nhwc", "broadcast"])
def test_a_transpose_runs_in_square_tiles_of_gathered_vectors(case):
    # an output vector gathers one element from each of 16 input rows; the next 15 vectors read
    # the rest of those rows' cache lines from L1 (BERT's key transpose: 103 -> 14 us). A
    # broadcast along the output's rows (a per-channel bias in NCHW) is no transpose
    from tvm import te

    if case == "key_heads":  # (seq, heads * dim) -> (heads, dim, seq), scaled
        x = te.placeholder((128, 768), name="x")
        y = te.compute((12, 64, 128), lambda h, d, s: x[s, h * 64 + d] * 0.125, name="y")
        want = lambda a: a.reshape(128, 12, 64).transpose(1, 2, 0) * 0.125  # noqa: E731
    elif case == "nchw_to_nhwc":
        x = te.placeholder((1, 64, 32, 32), name="x")
        y = te.compute((1, 32, 32, 64), lambda n, h, w, c: x[n, c, h, w], name="y")
        want = lambda a: a.transpose(0, 2, 3, 1)  # noqa: E731
    else:
        x = te.placeholder((1, 64, 32, 32), name="x")
        b = te.placeholder((64,), name="b")
        y = te.compute((1, 64, 32, 32), lambda n, c, h, w: x[n, c, h, w] + b[c], name="y")
    rng = np.random.default_rng(0)
    a = rng.standard_normal([int(d) for d in x.shape]).astype("float32")
    out_shape = tuple(int(d) for d in y.shape)
    if case == "broadcast":
        func = schedule_cpu(te.create_prim_func([x, b, y]), lanes=16, acc=16)
        bias = rng.standard_normal(64).astype("float32")
        assert not re.search(r"in range\(16\):$", _loops(func)[-2])
        np.testing.assert_allclose(_run(func, a, bias, out_shape=out_shape), a + bias[:, None, None], rtol=1e-6)
        return
    func = schedule_cpu(te.create_prim_func([x, y]), lanes=16, acc=16)
    loops = _loops(func)
    assert "T.parallel" in loops[0] and len(loops) == 3
    assert re.search(r"in range\(16\):$", loops[1]) and re.search(r"in T.vectorized\(16\):$", loops[2])
    np.testing.assert_allclose(_run(func, a, out_shape=out_shape), want(a), rtol=1e-6)


@pytest.mark.parametrize("widths", [(256, 32, 32, 32), (16, 48, 8), (64, 64)])
def test_a_concatenation_runs_one_vectorised_loop_per_input(widths):
    # DenseNet's batch-norm-ReLU over a channels-last concatenation: inlined whole, every element
    # went down the chain of if_then_else that picks its input (25 inputs: 75 -> 3.3 us)
    from tvm import te

    xs = [te.placeholder((1, 4, 4, w), name=f"x{i}") for i, w in enumerate(widths)]
    cat = te.compute((1, 4, 4, sum(widths)), lambda n, h, w, c: _pick(xs, widths, n, h, w, c), name="cat")
    y = te.compute(cat.shape, lambda *i: te.max(cat(*i) * 0.5 + 1.0, 0.0), name="y")
    func = schedule_cpu(te.create_prim_func([*xs, y]), lanes=16, acc=16)
    text = func.script()
    step = int(np.gcd.reduce(widths))
    assert text.count("T.vectorized") == len(widths) and f"T.vectorized({min(step, 16)})" in text
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((1, 4, 4, w)).astype("float32") for w in widths]
    want = np.maximum(np.concatenate(arrays, axis=3) * 0.5 + 1.0, 0.0)
    np.testing.assert_allclose(_run(func, *arrays, out_shape=want.shape), want, rtol=1e-6)


def _pick(xs, widths, n, h, w, c):  # noqa: ANN001, ANN202 - te index expressions
    """topi's concatenate: the last input whose start the index has passed."""
    from tvm import tirx

    starts = np.cumsum([0, *widths[:-1]])
    out = xs[0][n, h, w, c]
    for x, start in zip(xs[1:], starts[1:]):
        out = tirx.if_then_else(c >= int(start), x[n, h, w, c - int(start)], out)
    return out


@pytest.mark.parametrize("depthwise", [True, False])
def test_a_depthwise_window_is_unrolled_along_the_rows_it_slides_over(depthwise):
    # output pixel w reads input pixel w + kw: unrolled over kw, the vector loaded for row w at
    # tap kw is the one row w - 1 needs at kw + 1, and LLVM loads it once (MobileNetV2-224's ten
    # depthwise convolutions 1.25x). A convolution's rows read one broadcast each: unchanged
    prim, check = _window_conv(depthwise, 8, 14)
    func = schedule_cpu(prim, lanes=16, acc=16)
    assert ((3, "unroll") in _update_loops(func)) == depthwise
    check(func)


def _window(depthwise, height, width, c_in=32, c_out=32, stride=1):
    """te tensors of a 3x3 window at `stride` over an NHWC input already padded (x, weights B,
    output conv): per channel (depthwise, c_in channels) or a convolution c_in -> c_out."""
    from tvm import te

    x = te.placeholder((1, (height - 1) * stride + 3, (width - 1) * stride + 3, c_in), name="x")
    ry, rx = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
    if depthwise:
        b = te.placeholder((3, 3, c_in), name="B")
        y = te.compute((1, height, width, c_in), lambda n, h, w, c: te.sum(
            x[n, h * stride + ry, w * stride + rx, c] * b[ry, rx, c], axis=[ry, rx]), name="conv")
    else:
        b = te.placeholder((3, 3, c_in, c_out), name="B")
        rc = te.reduce_axis((0, c_in), "rc")
        y = te.compute((1, height, width, c_out), lambda n, h, w, o: te.sum(
            x[n, h * stride + ry, w * stride + rx, rc] * b[ry, rx, rc, o], axis=[ry, rx, rc]), name="conv")
    return x, b, y


def _window_conv(depthwise, height, width, c_in=32, c_out=32, stride=1):
    """`_window`'s PrimFunc, and a check of a schedule of it against numpy."""
    from tvm import te

    x, b, y = _window(depthwise, height, width, c_in, c_out, stride)

    def check(func):
        rng = np.random.default_rng(0)
        a = rng.standard_normal([int(d) for d in x.shape]).astype("float32")
        w = rng.standard_normal([int(d) for d in b.shape]).astype("float32")
        span_h, span_w = (height - 1) * stride + 1, (width - 1) * stride + 1
        window = [a[:, i:i + span_h:stride, j:j + span_w:stride, :] for i in range(3) for j in range(3)]
        want = sum(v * w[k // 3, k % 3] if depthwise else v @ w[k // 3, k % 3] for k, v in enumerate(window))
        got = _run(func, a, w, out_shape=[int(d) for d in y.shape])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    return te.create_prim_func([x, b, y]), check


def _prefetches(func):
    """(enclosing loops, prefetched BufferLoad, prefetch loop, the condition under which it
    fetches) for each prefetch in `func`."""
    from tvm import s_tir
    from tvm import tirx

    found = []

    def walk(stmt, loops):
        if isinstance(stmt, tirx.For):
            walk(stmt.body, [*loops, stmt])
        elif isinstance(stmt, tirx.SeqStmt):
            first = stmt.seq[0]
            if isinstance(first, tirx.For) and isinstance(first.body, tirx.IfThenElse) and "prefetch" in str(first.body):
                found.append((loops, first.body.then_case.value.args[1].args[0], first, first.body.condition))
            for s in stmt.seq:
                walk(s, loops)
        elif isinstance(stmt, s_tir.SBlockRealize):
            walk(stmt.block.body, loops)

    walk(func.body, [])
    return found


@pytest.mark.parametrize("m, k, n", [(28, 512, 512), (256, 1024, 512), (1, 512, 2048)])
def test_weights_streamed_from_memory_are_prefetched_a_chunk_ahead(m, k, n):
    # a model's weights are cold at every run: each column tile walks its panel in chunks and
    # prefetches the next chunk while its row tiles compute the current one (ResNet-50's
    # 3x3 512-channel convolution with cold caches 1.42x, the model 1.09x). 1 MiB of weights
    # against 56 KiB of rows: a few row tiles, bursts in every row tile and several times
    # within the chunk; 2 MiB against 1 MiB: one burst per row tile; one row (a classifier
    # head, x[k] @ W: its unit row has no variable, and every read once seemed to name it)
    import itertools

    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    wl, fused, w = _matmul_module(weight_as_input=False, m=m, k=k, n=n)
    target = build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    _, kernel = _kernel(scheduled)
    (loops, load, burst_loop, fetches), = _prefetches(kernel)
    tile = int(load.source.shape[-1])
    shape = [int(d) for d in load.source.shape]
    assert shape == [n // tile, k, tile]
    flat = (load.indices[0] * shape[1] + load.indices[1]) * shape[2] + load.indices[2]
    # loops: the column tiles (parallel), the chunks, then the loops that number the bursts
    columns, chunk, bursts = loops[0], loops[1], loops[2:]
    assert columns.kind == tirx.ForKind.PARALLEL
    kc = k // int(chunk.extent)
    ana = Analyzer()
    variables = [columns.loop_var, chunk.loop_var, *[b.loop_var for b in bursts], burst_loop.loop_var]
    at = tirx.IndexMap(variables, [flat, fetches], None)
    lines = set()
    for values in itertools.product(*[range(int(b.extent)) for b in [*bursts, burst_loop]]):
        address, fetched = at.map_indices([tirx.const(v, "int64") for v in (0, 0, *values)])
        if int(ana.simplify(fetched)):
            lines.add(int(ana.simplify(address)) * 4 // 64)
    # while it computes chunk 0 of the first panel, it fetches all of chunk 1 and nothing more
    first, end = kc * tile * 4 // 64, 2 * kc * tile * 4 // 64
    assert lines == set(range(first, end))
    feeds = random_inputs(wl.inputs)
    got = build.run(build.compile_scheduled(scheduled, target)[0], tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, np.maximum(feeds[0] @ w, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k, n, weight_as_input", [(4096, 256, 512, False), (28, 512, 512, True), (6, 96, 64, False)])
def test_weights_that_are_small_or_inputs_are_not_streamed(m, k, n, weight_as_input):
    # rows outweighing the weights (4 MiB of activations against 512 KiB of weights) keep the row tiles
    # outermost; weights passed as inputs are not re-laid, and small ones stay in cache
    wl, fused, w = _matmul_module(weight_as_input=weight_as_input, m=m, k=k, n=n)
    scheduled = build.schedule(fused, build.make_target("llvm"), "rules")
    _, kernel = _kernel(scheduled)
    assert _register_tiled(kernel.script()) and not _prefetches(kernel)


@pytest.mark.parametrize("calls, streamed", [(1, True), (3, False)])
def test_weights_passed_at_every_step_are_not_streamed(calls, streamed, monkeypatch):
    # an unrolled recurrence passes its recurrent weights at every step: they come from L2 but
    # at the first, and streamed as if from memory, an LSTM's (both directions, 295 KiB) ran
    # its model 1.07x slower; the same weights at one call are streamed
    monkeypatch.setattr(schedule, "l2_bytes", lambda: 1 << 20)  # 400 KiB of weights fit half
    wl, fused, w = _matmul_module(weight_as_input=False, m=28, k=320, n=320, calls=calls)
    target = build.make_target("llvm")
    scheduled = build.schedule(fused, target, "rules")
    kernels = [f for gv, f in scheduled.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint]
    assert len(kernels) == 1 and _register_tiled(kernels[0].script())
    assert bool(_prefetches(kernels[0])) == streamed
    feeds = random_inputs(wl.inputs)
    want = feeds[0]
    for _ in range(calls):
        want = np.maximum(want @ w, 0)
    got = build.run(build.compile_scheduled(scheduled, target)[0], tvm.cpu(), feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * float(np.abs(want).max()))


def test_an_element_shifted_along_the_innermost_axis_is_no_concatenation():
    # y[c] = x[c - 1] past the first channel reads like a two-input concatenation of lengths 1 and
    # 63; split there, neither loop would vectorise, while the whole axis does
    from tvm import te

    x = te.placeholder((1, 4, 4, 64), name="x")
    y = te.compute((1, 4, 4, 64), lambda n, h, w, c: tvm.tirx.if_then_else(c >= 1, x[n, h, w, c - 1], 0.0), name="y")
    func = schedule_cpu(te.create_prim_func([x, y]), lanes=16, acc=16)
    assert func.script().count("T.vectorized(16)") == 1
    a = np.random.default_rng(0).standard_normal((1, 4, 4, 64)).astype("float32")
    want = np.concatenate([np.zeros((1, 4, 4, 1), "float32"), a[..., :-1]], axis=3)
    np.testing.assert_allclose(_run(func, a, out_shape=want.shape), want)


@pytest.mark.parametrize("side, vectorised", [(64, True), (63, False)])
def test_a_resize_into_nchw_computes_its_coordinates_once_per_pixel(side, vectorised):
    # a segmentation model's last op: bilinear upsampling of channels-last scores, written NCHW.
    # A vector of an image row computes its coordinates once and gathers every channel's
    # values in turn (LRASPP's 21x64x64: 96 -> 71 us against the channels innermost, which
    # wrote a pixel's channels an image apart); where no vector divides the row, the channels
    # innermost: the coordinates computed once per pixel, not once per channel
    from tvm import te
    from tvm import topi

    x = te.placeholder((1, 8, 8, 21), name="x")
    r = topi.image.resize2d(x, [0.0] * 4, (side, side), layout="NHWC", method="linear",
                            coordinate_transformation_mode="half_pixel")
    y = te.compute((1, 21, side, side), lambda n, c, h, w: r[n, h, w, c], name="y")
    plain = te.create_prim_func([x, y])
    func = schedule_cpu(plain, lanes=16, acc=16)
    loops = _loops(func)
    assert "T.parallel" in loops[0], loops
    if vectorised:
        assert "T.vectorized(16)" in loops[-1] and re.search(r"in range\(21\):$", loops[-2]), loops
    else:
        assert re.search(r"in range\(21\):$", loops[-1]), loops
    a = np.random.default_rng(0).standard_normal((1, 8, 8, 21)).astype("float32")
    np.testing.assert_allclose(_run(func, a, out_shape=(1, 21, side, side)),
                               _run(plain, a, out_shape=(1, 21, side, side)), rtol=1e-6)


@pytest.mark.parametrize("columns, padded", [(197, True), (49, False)])
def test_columns_no_vector_divides_are_padded_to_whole_vectors_past_the_serial_limit(columns, padded):
    # ViT-base's Q @ K^T: 197 key columns, which no vector width divides, fell back to one dot
    # product per output down a strided column (10.5 ms a layer); padded to 208 columns, whole
    # vectors (0.54 ms). Up to SERIAL_INNER columns (Swin's 49-token windows) stay serial
    # accumulators inside the reduction: the padded copies cost them more than they saved
    func = schedule_cpu(_matmul(40, columns, 64), lanes=16)
    text = func.script()
    assert ("T.vectorized(16)" in text and "B_pad" in text) == padded
    _run_matmul(func, 40, columns, 64)


@pytest.mark.parametrize("columns, vectorised", [(197, True), (196, True), (33, True), (20, False)])
def test_elementwise_stages_of_a_ragged_row_run_whole_vectors_and_a_last_partial_one(columns, vectorised):
    # ViT's 197-token softmax: no vector width divides its rows, and its exp and normalisation
    # ran one element at a time; now whole vectors, the last partial one peeled off (also where
    # a quarter vector divides the row: ConViT's 196 tokens)
    from tvm import relax

    mod = relax.transform.LegalizeOps()(_softmax((6, columns)))
    func = next(f for gv, f in mod.functions.items() if gv.name_hint != "main")
    scheduled = schedule_cpu(func, lanes=16).with_attr("global_symbol", "main")
    text = scheduled.script()
    assert ("T.vectorized(T.int64(16))" in text and "_partition" in text) == vectorised
    a = np.random.default_rng(7).standard_normal((6, columns)).astype("float32")
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(_run(scheduled, a, out_shape=(6, columns)), e / e.sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width", [197, 196, 49, 33])
def test_reductions_over_ragged_rows_accumulate_whole_vectors(width):
    # ViT's 197-token softmax: no vector width divides its rows, and its max and sum ran as one
    # chain of scalar steps each (1x4x197x197: 210 us, onnxruntime's 32; now 37 us): now partial
    # results in vectors, adding the reduction's identity past the row's end, the last step apart
    # (196: whole vectors, not the quarter ones that divide it)
    func, reference = _softmax_layer_norm(6, width)
    scheduled = schedule_cpu(func, lanes=16)
    names = set(re.findall(r'sblock\("(\w+)"', scheduled.script()))
    for reduction in ("m", "s", "mu", "v"):  # the max, the exp sum, the mean and the variance
        assert any(n.startswith(f"{reduction}_rf_update") and n.endswith("_partition") for n in names), reduction
    a = np.random.default_rng(3).standard_normal((6, width)).astype("float32")
    np.testing.assert_allclose(_run(scheduled, a, out_shape=(6, width)), reference(a), rtol=1e-4, atol=1e-5)


def test_a_rows_division_by_a_per_row_value_is_one_reciprocal_per_row():
    # softmax's e / sum and layer norm's d / sqrt(var + eps): a vector division per element took
    # a fifth of ViT's softmax; as e * (1 / sum), LLVM divides once per row
    func, reference = _softmax_layer_norm(6, 64)
    scheduled = schedule_cpu(func, lanes=16)
    stores = [line for line in scheduled.script().splitlines() if re.match(r"\s*(y|out)\[v_i, v_j\] = ", line)]
    assert len(stores) == 2 and all("* (T.float32(1.0) / " in line for line in stores), stores
    a = np.random.default_rng(6).standard_normal((6, 64)).astype("float32")
    np.testing.assert_allclose(_run(scheduled, a, out_shape=(6, 64)), reference(a), rtol=1e-4, atol=1e-5)


def test_a_ragged_rows_reduction_reads_its_own_columns_and_declines_other_forms():
    # the partial sums' reads name the columns the row sums (here from column 3 on, of a wider
    # input), not the whole vectors' 208; a product has no guard: its chain stays serial
    from tvm import te

    x = te.placeholder((6, 202), "float32", name="x")
    prod = te.comm_reducer(lambda a, b: a * b, lambda t: tvm.tirx.const(1, t), name="prod")
    k, q = te.reduce_axis((0, 197), name="k"), te.reduce_axis((0, 197), name="q")
    s = te.compute((6,), lambda i: te.sum(x[i, k + 3], axis=k), name="s")
    p = te.compute((6,), lambda i: prod(x[i, q + 3] * 0.01 + 1, axis=q), name="p")
    out = te.compute((6, 197), lambda i, j: x[i, j + 3] - s[i] / 197 + p[i], name="out")
    scheduled = schedule_cpu(te.create_prim_func([x, out]), lanes=16)
    text = scheduled.script()
    assert "s_rf_update" in text and "p_rf" not in text
    assert "x[v_i, 3:200]" in text
    a = np.random.default_rng(4).standard_normal((6, 202)).astype("float32")
    row = a[:, 3:200]
    want = row - row.sum(1, keepdims=True) / 197 + np.prod(row * 0.01 + 1, axis=1, keepdims=True)
    np.testing.assert_allclose(_run(scheduled, a, out_shape=(6, 197)), want, rtol=1e-4, atol=1e-4)


def test_a_reduction_over_two_axes_keeps_the_vectors_that_divide_its_row():
    # a squeeze-excite mean over 4 x 56 (NCHW): the identity-filled partials take one reduction
    # axis only; its 56-wide rows keep eight-lane partial sums instead of one chain
    from tvm import te

    x = te.placeholder((6, 4, 56), "float32", name="x")
    r, c = te.reduce_axis((0, 4), name="r"), te.reduce_axis((0, 56), name="c")
    s = te.compute((6,), lambda i: te.sum(x[i, r, c], axis=[r, c]), name="s")
    out = te.compute((6, 4, 56), lambda i, j, k: x[i, j, k] - s[i] / 224, name="out")
    scheduled = schedule_cpu(te.create_prim_func([x, out]), lanes=16)
    assert re.search(r"T\.vectorized\(8\):\s+with T\.sblock\(\"s_rf_update", scheduled.script())
    a = np.random.default_rng(5).standard_normal((6, 4, 56)).astype("float32")
    want = a - a.sum((1, 2), keepdims=True) / 224
    np.testing.assert_allclose(_run(scheduled, a, out_shape=(6, 4, 56)), want, rtol=1e-4, atol=1e-5)


def test_a_transpose_written_flat_is_unfolded_into_its_axes_and_tiled():
    # PoolFormer's group norm: NHWC -> NCHW, reshaped to [1, 1, C * H * W], one output loop
    # whose index reads x[0, (j % 256) // 16, j % 16, j // 256]: one strided element at a time
    # (56 x 56 x 64: 258 us); re-laid as (c, h, w), it is a transpose run in tiles (28 us)
    from tvm import te

    x = te.placeholder((1, 16, 16, 32), "float32", name="x")
    out = te.compute((1, 1, 8192), lambda a, b, j: x[0, (j % 256) // 16, j % 16, j // 256], name="out")
    scheduled = schedule_cpu(te.create_prim_func([x, out]), lanes=16)
    text = scheduled.script()
    reads = [line for line in text.splitlines() if "T.reads(x[" in line]
    assert reads and all("//" not in line and "%" not in line for line in reads), reads
    assert "T.vectorized(16)" in text
    a = np.random.default_rng(8).standard_normal((1, 16, 16, 32)).astype("float32")
    np.testing.assert_array_equal(_run(scheduled, a, out_shape=(1, 1, 8192)), a.transpose(0, 3, 1, 2).reshape(1, 1, -1))


def test_a_refused_primitive_does_not_print_the_kernel_into_its_error():
    # the rules try primitives and take a refusal as an answer; TVM's default error rendering
    # prints the whole function into each refusal, and trying to inline each block of a
    # 256-operator group (RWKV's unrolled recurrence fused whole) took 381 s instead of 1.6 s
    from tvm import s_tir

    from autofuse.schedule import new_schedule

    _, fused, _ = _matmul_module(weight_as_input=False)
    _, kernel = _kernel(fused)
    sch = new_schedule(kernel)
    with pytest.raises(s_tir.ScheduleError) as refused:
        sch.compute_inline(sch.get_sblock("matmul"))  # a reduction: refused
    assert "prim_func" not in str(refused.value) and "matmul_intermediate" not in str(refused.value)


def test_streamed_convolution_rows_are_grouped_in_whole_image_rows():
    # YOLOX's 13x13 head: conv 96 -> 96 3x3 -> SiLU -> the same again, merged into one kernel.
    # The first convolution's output is read by the second's padding, so its rows stay (image
    # row, row tile); its 331 KiB of weights stream, and its rows were split into parallel
    # groups across image rows while each group wrote back whole image rows, its neighbours'
    # unfinished outputs included (ddddocr's detector: every plan with the merge rejected)
    from tvm import relax

    from autofuse.workload import prepare

    rng = np.random.default_rng(9)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 96, 13, 13), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(2):
                w = relax.const((rng.standard_normal((96, 96, 3, 3)) * 0.05).astype("float32"))
                y = bb.emit(relax.op.nn.silu(relax.op.nn.conv2d(y, w, padding=1)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    w = prepare(bb.get())
    plan = SearchSpace(w.graph).plan_of_kinds({"vertical"})
    fused = apply.apply_plan(w.mod, w.graph, plan)
    assert any(sum("conv2d" in w.graph.nodes[n].op for n in g) == 2 for g in plan.groups)
    target = build.make_target("llvm")
    feeds = random_inputs(w.inputs)
    want, got = (build.run(build.build(fused, target, s), tvm.cpu(), feeds) for s in ("none", "rules"))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def _run(func, *arrays, out_shape, out_dtype="float32"):
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    out = tvm.runtime.tensor(np.zeros(out_shape, out_dtype))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


def _matmul_plus_channel_stage(m, n, k, costly):
    """A matmul whose epilogue adds a per-column value computed in the kernel from a run-time
    scalar: floor(bias / scale) (a bias quantized at run time) or bias * scale + 1 (cheap)."""
    from tvm import te

    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    bias = te.placeholder((n,), "float32", name="bias")
    scale = te.placeholder((), "float32", name="scale")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    stage = te.compute((n,), (lambda j: te.floor(bias[j] / scale[()])) if costly
                       else (lambda j: bias[j] * scale[()] + 1.0), name="stage")
    out = te.compute((m, n), lambda i, j: c[i, j] + stage[j], name="out")
    return te.create_prim_func([a, b, bias, scale, out])


def test_a_costly_stage_read_broadcast_is_computed_once_not_per_element():
    # ddddocr's int8 CRNN quantizes each convolution's bias at run time (floor(bias / scale),
    # cast guards): inlined, that ran for every output pixel (a 32x128x24 convolution 2.10 ->
    # 0.26 ms computed once per channel)
    m, n, k = 256, 64, 128
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), "float32"), rng.standard_normal((k, n), "float32")
    bias, scale = (rng.standard_normal(n) * 50).astype("float32"), np.array(0.7, "float32")
    costly = schedule_cpu(_matmul_plus_channel_stage(m, n, k, True), lanes=16, acc=24)
    assert 'T.sblock("stage")' in costly.script()  # a loop of its own over the 64 columns
    np.testing.assert_allclose(_run(costly, a, b, bias, scale, out_shape=(m, n)),
                               a @ b + np.floor(bias / scale), rtol=1e-5, atol=1e-3)
    cheap = schedule_cpu(_matmul_plus_channel_stage(m, n, k, False), lanes=16, acc=24)
    assert 'T.sblock("stage")' not in cheap.script()  # a multiply-add: inlined into the tile's epilogue
    np.testing.assert_allclose(_run(cheap, a, b, bias, scale, out_shape=(m, n)),
                               a @ b + bias * scale + 1, rtol=1e-5, atol=1e-3)


def _whole_reduction(shape, kind):
    from tvm import te

    x = te.placeholder(shape, "float32", name="x")
    axes = [te.reduce_axis((0, d)) for d in shape]
    reduce = {"min": te.min, "sum": te.sum}[kind]
    y = te.compute((), lambda: reduce(x[tuple(axes)], axis=axes), name="y")
    return te.create_prim_func([x, y])


@pytest.mark.parametrize("shape, kind, scheduled", [((16, 64, 192), "min", True), ((1, 32, 128, 24), "min", True),
                                                    ((1 << 16,), "sum", True), ((3, 5, 7, 113), "sum", False)])
def test_a_whole_tensor_reduction_runs_in_parallel_vectorised_chunks(shape, kind, scheduled):
    # DynamicQuantizeLinear's min and max over a 16x64x192 activation ran one element at a time
    # on one core (107 us; 4.2 us in chunks); a size no vector divides is left as it was
    func = schedule_cpu(_whole_reduction(shape, kind), lanes=16, acc=24)
    text = func.script() if func is not None else ""
    assert ("T.parallel" in text and "T.vectorized" in text) == scheduled
    if shape[-1] == 24:  # vectors of 8 along the rows: 16 would straddle two rows (read lane by lane)
        assert "T.vectorized(8)" in text
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    x.flat[12345 % x.size] = -40.0
    got = _run(func or _whole_reduction(shape, kind), x, out_shape=())
    np.testing.assert_allclose(got, x.min() if kind == "min" else x.sum(dtype="float64"), rtol=1e-4)


def test_costly_elementwise_kernels_run_in_parallel_from_fewer_elements():
    from tvm import te

    x = te.placeholder((64, 1024), "float32", name="x")
    s = te.placeholder((), "float32", name="s")
    costly = te.compute((64, 1024), lambda i, j: te.round(x[i, j] / s[()]), name="q")
    cheap = te.compute((64, 1024), lambda i, j: x[i, j] * s[()], name="m")
    assert "T.parallel" in schedule_cpu(te.create_prim_func([x, s, costly]), lanes=16, acc=24).script()
    assert "T.parallel" not in schedule_cpu(te.create_prim_func([x, s, cheap]), lanes=16, acc=24).script()


def test_a_whole_tensor_argmax_stays_a_correct_serial_loop():
    # rfactor knows no reducer of (index, value) pairs: the rule leaves the loop serial rather
    # than failing the kernel's whole schedule
    from tvm import te
    from tvm import topi

    x = te.placeholder((16, 64, 192), "float32", name="x")
    y = topi.argmax(x)
    func = schedule_cpu(te.create_prim_func([x, y]), lanes=16, acc=24)
    assert func is not None and "T.parallel" not in func.script()
    a = np.random.default_rng(2).standard_normal((16, 64, 192)).astype("float32")
    assert _run(func, a, out_shape=(), out_dtype=str(y.dtype)) == a.argmax()



def _one_element_reductions():
    from onnx import helper

    node = helper.make_node
    # ONNX's test_qlinearconv written as QDQ: a 1x1 convolution of one channel, then requantized
    qdq = ([node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]), node("Conv", ["xf", "w"], ["c"]),
            node("QuantizeLinear", ["c", "sy", "zy"], ["y"])],
           {"x": ("uint8", (1, 1, 7, 7))},
           {"w": np.array([[[[0.25]]]], "float32"), "sx": np.array(0.5, "float32"), "zx": np.array(12, "uint8"),
            "sy": np.array(0.125, "float32"), "zy": np.array(3, "uint8")})
    # an outer product written as a matmul with K = 1, then an epilogue
    outer = ([node("MatMul", ["a", "b"], ["c"]), node("Relu", ["c"], ["r"]), node("Add", ["r", "a2"], ["y"])],
             {"a": ("float32", (16, 1)), "b": ("float32", (1, 24)), "a2": ("float32", (16, 24))}, {})
    return [qdq, outer]


@pytest.mark.parametrize("case", [0, 1])
def test_reductions_over_one_element_keep_their_epilogues_apart(tmp_path, case):
    """A reduction over axes of one element loses them in normalize_prim_func but keeps its
    init; TIR inlined the epilogue into init and update alike (every output of the requantized
    convolution 255). Built with TVM's plan (the epilogue fused) and checked against onnxruntime."""
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper
    from onnx_import import import_and_run

    from autofuse.importer import run_onnxruntime

    nodes, inputs, consts = _one_element_reductions()[case]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), list(s)) for n, (d, s) in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.UINT8 if consts else TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    w, feeds, got = import_and_run(model, tmp_path, plan="tvm_default")
    assert any(len(g) > 1 for g in w.tvm_default().groups)  # the epilogue is fused
    want = run_onnxruntime(model, w.inputs, feeds)
    np.testing.assert_allclose(got[0].astype("float64"), want[0].astype("float64"), rtol=1e-5, atol=1e-5)
    # DLight (CUDA, built here without a GPU) inlined the epilogue the same way: the fused
    # kernel is now one spatial block, the accumulator's read replaced by its init value
    fused = apply.apply_plan(w.mod, w.graph, w.tvm_default())
    scheduled = build.schedule(fused, build.make_target("cuda:sm_90"), "dlight")
    kernels = [f.script() for _, f in scheduled.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert kernels and not any("T.init()" in k for k in kernels)


def test_unchecked_schedule_methods_give_the_same_kernels():
    # the measurement worker skips TIR Schedule's Python argument checks (tvm_bridge); in a
    # fresh process, so this test process keeps them: the rules must schedule every kernel of
    # the demo model to the same TIR either way, and the FFI still refuses a wrong argument
    code = """
import tvm
from autofuse import apply, build, models
from autofuse.tvm_bridge import skip_schedule_type_checks
from autofuse.workload import prepare
from tvm import s_tir
import tempfile
w = prepare(models.write_builtin("transformer_block", tempfile.mkdtemp()))
fused = apply.apply_plan(w.mod, w.graph, w.tvm_default())
target = build.make_target("llvm")
checked = build.schedule(fused, target, "rules")
print("unwrapped", skip_schedule_type_checks())
unchecked = build.schedule(fused, target, "rules")
print("same", checked.script() == unchecked.script())
sch = s_tir.Schedule(fused[next(gv for gv in fused.get_global_vars() if gv.name_hint != "main")])
try:
    sch.get_loops(42)
except Exception as err:
    print("refused", type(err).__name__)
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert int(next(x for x in lines if x.startswith("unwrapped")).split()[1]) > 40
    assert "same True" in lines and any(x.startswith("refused") for x in lines)


def test_inlining_stops_where_copies_of_a_stage_would_swamp_the_kernel():
    # each stage reads the one before twice: inlined all the way, the last block would hold
    # 2^14 copies of the first stage's expression (RWKV's recurrence, fused whole: six kernels of
    # 1.6-1.9 MB of TIR, 8-11 s each to lower); stages past the bound stay blocks of their own
    from tvm import te

    from autofuse.schedule import MAX_INLINED_CHARS

    def step(s: te.Tensor, k: int) -> te.Tensor:
        return te.compute((4, 64), lambda i, j: s[i, j] * (s[i, j] - 0.5), name=f"s{k}")

    x = te.placeholder((4, 64), name="x")
    stage = x
    for k in range(14):
        stage = step(stage, k)
    func = te.create_prim_func([x, stage])
    scheduled = schedule_cpu(func, lanes=8, acc=12)
    text = scheduled.script()
    blocks = re.findall(r'T\.sblock\("s\d+"', text)
    assert 1 < len(blocks) < 14  # some stages inlined, not all
    assert len(text) < 4 * MAX_INLINED_CHARS
    lib = tvm.tirx.build(tvm.IRModule({"main": scheduled}), target=build.make_target("llvm"))
    feed = np.random.default_rng(0).uniform(-0.4, 0.1, (4, 64)).astype("float32")
    want = feed.astype("float64")
    for _ in range(14):
        want = want * (want - 0.5)
    out = tvm.runtime.tensor(np.zeros((4, 64), "float32"))
    lib["main"](tvm.runtime.tensor(feed), out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-6)


def test_roi_align_runs_its_channels_innermost_and_matches_the_plain_loops():
    """RoiAlign computes each bin's bilinear sample positions from the box (floors, divisions)
    and reads every channel there: with the channels innermost the positions are computed once
    per sample, not once per channel (Faster R-CNN's box head, 64 boxes: 15.6 -> 6.2 ms)."""
    from tvm import relax
    from tvm import tirx

    bb = relax.BlockBuilder()
    feat = relax.Var("feat", relax.TensorType([1, 32, 10, 10], "float32"))
    rois = relax.Var("rois", relax.TensorType([6, 5], "float32"))
    with bb.function("main", [feat, rois]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.vision.roi_align(feat, rois, (7, 7), 0.25, sample_ratio=2))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    (name, func), = ((gv.name_hint, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc))
    text = schedule_cpu(func, 16, 24).script()
    innermost = [line for line in text.splitlines() if " for " in line][-1]
    assert "T.int64(32)" in innermost, text  # the channel loop, inside the 2x2 samples
    rng = np.random.default_rng(0)
    corners = rng.uniform(0, 30, (6, 2)).astype("float32")
    boxes = np.concatenate([np.zeros((6, 1), "float32"), corners, corners + rng.uniform(2, 10, (6, 2))], 1)
    inputs = [rng.standard_normal((1, 32, 10, 10)).astype("float32"), boxes.astype("float32")]
    target = build.make_target("llvm")
    dev = build.device_for(target)
    plain = build.run(build.build(mod, target, scheduler="none"), dev, inputs)[0]
    tuned = build.run(build.build(mod, target), dev, inputs)[0]
    np.testing.assert_allclose(tuned, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("side", "grouped"), [(17, False), (16, True)])
def test_streamed_rows_split_into_parallel_groups_only_over_whole_tiles(side, grouped):
    # Inception-v3's 7x1 convolutions 192 -> 192 on 17x17: 1 MiB of weights to stream, 289
    # rows in 12-row tiles (AVX-512), the last one predicated. Split into parallel groups of
    # row tiles, the predicate read the group from the parallel loop (par % groups), no pass
    # took it out of the reduction's steps, and every tile loaded and stored its accumulators
    # at each step: 1.26 ms a call, 0.43 ms not streamed. 16x16: 256 rows in whole 8-row
    # tiles, streamed in groups as before
    from tvm import s_tir
    from tvm import tirx

    from autofuse.schedule import pack_array

    prim, _ = _padded_conv(side, 192, 192, (7, 1), 1, constant_weights=True)
    func = schedule_cpu(prim, lanes=16, acc=24)
    sch = s_tir.Schedule(func)
    par = sch.get(sch.get_loops(sch.get_sblock("conv_update"))[0])
    assert par.kind == tirx.ForKind.PARALLEL
    tile = int(func.params[1].shape[-1])
    assert bool(_prefetches(func)) == grouped
    assert int(par.extent) > 192 // tile or not grouped  # column tiles x row groups
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, side, side, 192)).astype("float32")
    w = (rng.standard_normal((7, 1, 192, 192)) * 0.05).astype("float32")
    p = np.pad(a, ((0, 0), (3, 3), (0, 0), (0, 0)))
    want = sum(p[:, i:i + side] @ w[i, 0] for i in range(7))
    got = _run(func, a, pack_array(w, tile), out_shape=(1, side, side, 192))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("depthwise", [True, False])
def test_a_depthwise_tile_stays_on_the_stack_a_convolutions_need_not(depthwise):
    # a depthwise convolution reduces over its 9 taps only: a tile from the workspace pool,
    # zeroed, stored and copied at every tile, cost more than it computed (ESE-VoVNet's
    # 56x56x128 one in 8x2 tiles of 16 lanes, 1 KiB: 50-52 us alone; 7x2 tiles on the stack
    # 37 us). A convolution's 288-step reduction keeps AVX-512's 8x2 tiles, pooled
    prim, check = _window_conv(depthwise, 56, 56)
    func = schedule_cpu(prim, lanes=16, acc=24)
    assert "T.parallel" in func.script()
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    assert ("TVMBackendAllocWorkspace" in lib.mod.inspect_source("ll")) != depthwise
    check(func)
