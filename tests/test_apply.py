"""apply_plan: one kernel per group, FuseOps parity, BatchNorm folding, random legal plans."""

from pathlib import Path

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from tvm import relax

from autofuse import apply
from autofuse import build
from autofuse.build import MeasureConfig
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.measure import IsolatedMeasurer
from autofuse.plan import FusionPlan
from autofuse.space import SearchSpace
from autofuse.workload import prepare


def kernels(mod):
    """Structural hashes of the PrimFuncs main calls, in call order (names do not matter)."""
    from tvm_ffi import structural_hash

    op = tvm.ir.Op.get("relax.call_tir")
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and b.value.op.same_as(op):
                prim = mod[b.value.args[0]]
                out.append(structural_hash(prim.with_attr("global_symbol", "k")))
    return out


def fuseops_reference(mod):
    seq = tvm.transform.Sequential(
        [relax.transform.FuseOps(), relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()]
    )
    return seq(mod)


@pytest.mark.parametrize("name", ["small", "conv_block", "transformer", "mlp"])
def test_tvm_default_reproduces_fuseops(name, request):
    w = request.getfixturevalue(name)
    ours = apply.apply_plan(w.mod, w.graph, w.tvm_default())
    theirs = fuseops_reference(w.mod)
    assert len(kernels(ours)) == w.tvm_default().num_kernels
    assert sorted(kernels(ours)) == sorted(kernels(theirs))


def test_one_kernel_per_group(transformer):
    space = SearchSpace(transformer.graph)
    for kinds in ({"vertical"}, {"horizontal"}, {"reduction", "vertical"}, {"vertical", "horizontal", "reduction"}):
        plan = space.plan_of_kinds(kinds)
        fused = apply.apply_plan(transformer.mod, transformer.graph, plan)
        assert len(kernels(fused)) == plan.num_kernels


def run_plan(w, plan, target="llvm"):
    t = build.make_target(target)
    ex = build.build(apply.apply_plan(w.mod, w.graph, plan), t)
    return build.run(ex, build.device_for(t), random_inputs(w.inputs))


def test_horizontal_and_multi_output_groups(small):
    # exp(x) and x*x share an input; relu's output feeds both sum and divide outside its group
    plan = FusionPlan.from_groups([[0, 1], [2], [3], [4, 6], [5], [7]])
    ref = run_plan(small, small.unfused())
    np.testing.assert_allclose(run_plan(small, plan)[0], ref[0], rtol=1e-5, atol=1e-6)
    plan = FusionPlan.from_groups([[0, 1, 4], [2], [3], [5], [6], [7]])
    np.testing.assert_allclose(run_plan(small, plan)[0], ref[0], rtol=1e-5, atol=1e-6)


def test_batchnorm_folded_into_conv(model_dir):
    w = prepare(model_dir / "conv_block.onnx", simplify=False)
    onnx_ops = {n.op_type for n in w.loaded.onnx_model.graph.node} if w.loaded.onnx_model else set()
    assert "BatchNormalization" in onnx_ops or w.loaded.onnx_model is None
    assert "batch_norm" not in w.mod.script() and "rsqrt" not in w.mod.script()
    # conv -> add(bias) -> relu: the folded bias is an add on the conv output; the graph is
    # channels-last inside: one transpose at the input, one where NCHW is needed again
    ops = [n.op for n in w.graph.nodes]
    assert ops[0].startswith("transpose")
    assert ops[1].startswith("conv2d") and ops[2].startswith("add")
    assert sum(op.startswith("transpose") for op in ops) == 2, ops
    assert "conv2d_nhwc" in w.mod.script()
    feeds = random_inputs(w.inputs)
    want = run_onnxruntime(w.loaded.onnx_model, w.inputs, feeds)[0]
    got = run_plan(w, w.unfused())[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cuda_builds_without_gpu(transformer):
    space = SearchSpace(transformer.graph)
    t = build.make_target("cuda")
    for plan in (transformer.tvm_default(), space.plan_of_kinds({"vertical", "horizontal", "reduction"})):
        ex = build.build(apply.apply_plan(transformer.mod, transformer.graph, plan), t)
        assert "vm_tir_func" not in ex.as_text()  # bytecode until the compiled form has run on a GPU


def test_main_is_compiled_beside_the_kernels_and_runs_from_an_exported_library(transformer, tmp_path):
    # build compiles main's calls between kernels into a host function (VMTIRCodeGen) rather
    # than bytecode for the VM to interpret; the kernels are the same, so the outputs are too,
    # bit for bit, also from the exported library loaded back
    mod = apply.apply_plan(transformer.mod, transformer.graph, transformer.tvm_default())
    t = build.make_target("llvm")
    compiled, bytecode = build.build(mod, t), build.build(mod, t, exec_mode="bytecode")
    assert "vm_tir_func" in compiled.as_text() and "vm_tir_func" not in bytecode.as_text()
    compiled.export_library(tmp_path / "model.so")
    loaded = tvm.runtime.load_module(tmp_path / "model.so")
    feeds = [tvm.runtime.tensor(x, tvm.cpu()) for x in random_inputs(transformer.inputs)]
    want = relax.VirtualMachine(bytecode, tvm.cpu())["main"](*feeds).numpy()
    got = relax.VirtualMachine(loaded, tvm.cpu())["main"](*feeds).numpy()
    np.testing.assert_array_equal(got, want)


def test_a_main_of_more_calls_than_the_limit_stays_bytecode(mlp, monkeypatch):
    # LLVM's time on the compiled main grows faster than its length (a narrow 48-layer BERT: 15 s)
    mod = apply.apply_plan(mlp.mod, mlp.graph, mlp.tvm_default())
    t = build.make_target("llvm")
    assert "vm_tir_func" in build.build(mod, t).as_text()
    monkeypatch.setattr(build, "COMPILED_MAX_CALLS", 5)
    assert "vm_tir_func" not in build.build(mod, t).as_text()
    assert "vm_tir_func" in build.build(mod, t, exec_mode="compiled").as_text()  # asked for: no limit


def test_a_main_the_compiled_form_cannot_build_is_built_as_bytecode(mlp, monkeypatch):
    real = relax.build

    def refuse_compiled(*args, exec_mode="bytecode", **kwargs):
        if exec_mode == "compiled":
            raise RuntimeError("VMTIRCodeGen: not supported")
        return real(*args, exec_mode=exec_mode, **kwargs)

    monkeypatch.setattr(relax, "build", refuse_compiled)
    mod = apply.apply_plan(mlp.mod, mlp.graph, mlp.tvm_default())
    ex = build.build(mod, build.make_target("llvm"))
    assert "vm_tir_func" not in ex.as_text()
    feeds = random_inputs(mlp.inputs)
    want = run_onnxruntime(mlp.loaded.onnx_model, mlp.inputs, feeds)[0]
    np.testing.assert_allclose(build.run(ex, tvm.cpu(), feeds)[0], want, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="exec_mode 'interpreted'"):
        build.build(mod, build.make_target("llvm"), exec_mode="interpreted")


@pytest.mark.parametrize("name", ["mlp", "transformer", "conv_block"])
def test_random_cuda_plans_build_with_dlight_fallbacks(name, request):
    # DLight's Matmul rule raises on some fused groups (an mlp plan: AssertionError): the next
    # rule schedules such a kernel instead; every kernel lands in the CUDA module (an
    # unscheduled one would silently be compiled for the host)
    from autofuse.batch import candidate_plans
    from autofuse.gpu_resources import cuda_source
    from autofuse.space import load_limits

    w = request.getfixturevalue(name)
    _, limits = load_limits("gpu")
    t = build.make_target("cuda")
    for _, plan in candidate_plans(w, SearchSpace(w.graph, limits), 8, "cuda"):
        fused, kernels = apply.fuse(w.mod, w.graph, plan)
        source = cuda_source(build.build(fused, t).mod)
        assert source is not None and all(f"{k}_kernel" in source for k in set(kernels))


def test_dlight_schedule_that_fails_to_lower_gives_way_to_the_next_rule():
    # GPT-2's QKV projection: DLight's Matmul rule accepts a matmul+split kernel, but its TIR
    # does not lower ("buffer used before its definition"); such a plan used to be a build_error
    from autofuse.gpu_resources import cuda_source

    w = prepare(Path(__file__).parent / "qkv_module.py")
    assert [n.op for n in w.graph.nodes] == ["matmul", "split", "multiply", "add"]
    fused, kernels = apply.fuse(w.mod, w.graph, FusionPlan(((0, 1), (2, 3))))
    source = cuda_source(build.build(fused, build.make_target("cuda:sm_90")).mod)
    assert source is not None and all(f"{k}_kernel" in source for k in set(kernels))


def test_dlight_rules_refuse_without_printing_the_kernel(transformer, monkeypatch):
    # DLight's rules try primitives and take refusals as answers; each refusal printed the
    # kernel into its message (Fallback on a 256-operator kernel: 400 s of it). Only while
    # DLight runs: a schedule made afterwards renders its errors as TVM's default does
    from tvm import s_tir

    refusals = []
    inline = s_tir.Schedule.compute_inline

    def recording(self, block):
        try:
            return inline(self, block)
        except s_tir.ScheduleError as err:
            refusals.append(str(err))
            raise

    monkeypatch.setattr(s_tir.Schedule, "compute_inline", recording)
    fused = apply.apply_plan(transformer.mod, transformer.graph, transformer.tvm_default())
    build.schedule(fused, build.make_target("cuda"), "dlight")
    assert refusals and not any("prim_func" in r for r in refusals)
    kernel = next(f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    sch = s_tir.Schedule(kernel)
    with pytest.raises(s_tir.ScheduleError, match="prim_func"):
        sch.compute_inline(sch.get_sblock("root"))


def _random_plan(space, data):
    return space.decode({d.id: data.draw(st.booleans()) for d in space.decisions})


@pytest.fixture(scope="module")
def measurers(conv_block, transformer):
    cfg = MeasureConfig(number=1, repeat=1, min_repeat_ms=0, timeout_s=120)
    with IsolatedMeasurer(conv_block, config=cfg) as a, IsolatedMeasurer(transformer, config=cfg) as b:
        yield {"conv_block": (conv_block, a), "transformer": (transformer, b)}


@pytest.mark.parametrize("name", ["conv_block", "transformer"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_legal_plans_build_and_match(measurers, name, data):
    w, measurer = measurers[name]
    plan = _random_plan(SearchSpace(w.graph), data)
    result = measurer.measure(plan)
    assert result.status == "ok", result.error
    assert result.max_abs_err is not None and result.max_abs_err < 1e-4


def test_tuple_output_kernels_fuse_like_fuseops():
    w = prepare(Path(__file__).parent / "split_module.py")
    split = next(n for n in w.graph.nodes if n.op.startswith("split"))
    assert split.dtype == "tuple" and split.fusable
    plan = w.tvm_default()
    assert any(split.id in g and len(g) > 1 for g in plan.groups)
    assert sorted(kernels(apply.apply_plan(w.mod, w.graph, plan))) == sorted(kernels(fuseops_reference(w.mod)))
    ref = run_plan(w, w.unfused())[0]
    for p in (plan, SearchSpace(w.graph).plan_of_kinds({"vertical", "horizontal", "reduction"})):
        np.testing.assert_allclose(run_plan(w, p)[0], ref, rtol=1e-6)
