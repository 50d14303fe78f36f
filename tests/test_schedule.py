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


def test_matmul_gets_parallel_vectorised_gemm_order(mlp):
    fused, kernels = apply.fuse(mlp.mod, mlp.graph, mlp.tvm_default())
    name = next(k for k in kernels if k.startswith("fused_matmul"))
    text = schedule_cpu(fused[name]).script()
    assert "T.parallel" in text and "T.vectorized" in text and "_init" in text
    assert SCHEDULED_ATTR in schedule_cpu(fused[name]).attrs


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
