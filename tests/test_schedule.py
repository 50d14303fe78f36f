import numpy as np
import pytest
import tvm

from autofuse import apply
from autofuse import build
from autofuse.importer import random_inputs
from autofuse.schedule import SCHEDULED_ATTR
from autofuse.schedule import ScheduleCPU
from autofuse.schedule import schedule_cpu
from autofuse.space import SearchSpace


def test_matmul_gets_register_tiled_gemm(mlp):
    fused, kernels = apply.fuse(mlp.mod, mlp.graph, mlp.tvm_default())
    name = next(k for k in kernels if k.startswith("fused_matmul"))
    text = schedule_cpu(fused[name]).script()
    assert "T.vectorized" in text and "_init" in text and 'scope="local"' in text
    # the MLP's matmuls are too small to pay for waking a second thread
    assert "T.parallel" not in text
    assert SCHEDULED_ATTR in schedule_cpu(fused[name]).attrs


def _matmul(m, n, k, lanes_dtype="float32"):
    from tvm import te

    a = te.placeholder((m, k), lanes_dtype, name="A")
    b = te.placeholder((k, n), lanes_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


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


def test_prime_row_count_gets_a_predicated_row_tile():
    # 17 rows (ViT's tokens): a 6-row tile with a partial, predicated last tile, not 1 row
    func = schedule_cpu(_matmul(17, 32, 64), lanes=16)
    text = func.script()
    assert "T.unroll(6)" in text and "T.where" in text
    a, b = np.random.rand(17, 64).astype("float32"), np.random.rand(64, 32).astype("float32")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    out = tvm.runtime.tensor(np.zeros((17, 32), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


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
