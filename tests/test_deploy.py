"""The deployment API: a pass usable inside anyone's Relax pipeline, and build()."""

import numpy as np
import pytest
import tvm
from tvm import relax

from autofuse import build as builder
from autofuse import deploy
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.measure import Measurement
from autofuse.space import SearchSpace
from autofuse.tuning_log import TuningLog
from autofuse.tuning_log import TuningRecord
from autofuse.tvm_bridge import is_call_tir


def log_plan(log_dir, w, plan, target="llvm"):
    m = Measurement(plan.key, "ok", latencies_s=(1e-4, 1e-4))
    TuningLog(log_dir).append(TuningRecord(w.key, w.name, target, "none", plan.to_dict(), m.to_dict(), role="best"))


def test_pass_applies_cached_plan_in_a_user_pipeline(transformer, tmp_path):
    w = transformer
    plan = SearchSpace(w.graph).plan_of_kinds({"vertical", "horizontal", "reduction"})
    assert plan != w.tvm_default()
    log_plan(tmp_path, w, plan)
    fusion = deploy.AutofuseFusion(tmp_path, "llvm", strict=True)
    # the user's own pipeline: import, then our pass (it legalises, as the README says), then
    # the user's scheduling and lowering
    user = tvm.transform.Sequential([fusion])
    fused = user(w.loaded.mod)
    assert fusion.chosen.source == "log" and fusion.chosen.plan == plan
    calls = [b for blk in fused["main"].body.blocks for b in blk.bindings if is_call_tir(b)]
    assert len(calls) == plan.num_kernels
    ex = builder.build(fused, builder.make_target("llvm"))
    feeds = random_inputs(w.inputs)
    got = builder.run(ex, tvm.cpu(), feeds)[0]
    want = run_onnxruntime(w.loaded.onnx_model, w.inputs, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_pass_finds_conv_plans_before_legalization(conv_block, tmp_path):
    # the channels-last layout a conv model was tuned in is introduced by the pass itself, so it
    # must see the module before LegalizeOps (as the README says)
    w = conv_block
    plan = SearchSpace(w.graph).plan_of_kinds({"vertical", "reduction"})
    log_plan(tmp_path, w, plan)
    fusion = deploy.AutofuseFusion(tmp_path, "llvm", strict=True)
    fused = tvm.transform.Sequential([fusion])(w.loaded.mod)
    assert fusion.chosen.source == "log" and fusion.chosen.plan == plan
    feeds = random_inputs(w.inputs)
    got = builder.run(builder.build(fused, builder.make_target("llvm")), tvm.cpu(), feeds)[0]
    want = run_onnxruntime(w.loaded.onnx_model, w.inputs, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    after_legalize = deploy.AutofuseFusion(tmp_path, "llvm", strict=True)
    with pytest.raises((deploy.PlanNotFound, RuntimeError)):
        tvm.transform.Sequential([relax.transform.LegalizeOps(), after_legalize])(w.loaded.mod)


def test_pass_falls_back_to_fuseops(mlp, tmp_path):
    fusion = deploy.AutofuseFusion(tmp_path, "llvm")
    with pytest.warns(UserWarning, match="default fusion"):
        fusion(mlp.loaded.mod)
    assert fusion.chosen.source == "fallback" and fusion.chosen.plan == mlp.tvm_default()
    with pytest.raises((deploy.PlanNotFound, RuntimeError), match="no valid tuned plan"):
        deploy.AutofuseFusion(tmp_path, "llvm", strict=True)(mlp.loaded.mod)


def test_build_convenience(mlp, tmp_path):
    plan = SearchSpace(mlp.graph).plan_of_kinds({"vertical", "reduction"})
    log_plan(tmp_path, mlp, plan)
    ex, chosen = deploy.build(mlp, "llvm", tmp_path)
    assert chosen.plan == plan
    feeds = random_inputs(mlp.inputs)
    want = run_onnxruntime(mlp.loaded.onnx_model, mlp.inputs, feeds)[0]
    np.testing.assert_allclose(builder.run(ex, tvm.cpu(), feeds)[0], want, rtol=1e-4, atol=1e-6)


def test_a_plan_tuned_on_other_threads_says_so(mlp, tmp_path, monkeypatch):
    # the plan that wins depends on the thread count: apply names the one it was tuned on
    plan = SearchSpace(mlp.graph).plan_of_kinds({"vertical"})
    m = Measurement(plan.key, "ok", latencies_s=(1e-4, 1e-4))
    TuningLog(tmp_path).append(TuningRecord(mlp.key, mlp.name, "llvm", "none", plan.to_dict(), m.to_dict(),
                                            role="best", protocol={"threads": 3}))
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    chosen = deploy.choose_plan(mlp.key, mlp.graph, mlp.tvm_default(), tmp_path, "llvm")
    assert chosen.plan == plan and "tuned on 3 threads: run it with TVM_NUM_THREADS=3" in chosen.note
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert "threads" not in deploy.choose_plan(mlp.key, mlp.graph, mlp.tvm_default(), tmp_path, "llvm").note


def test_tuning_records_the_thread_count(small, tmp_path):
    from autofuse.build import cpu_threads
    from autofuse.search import TuneConfig
    from autofuse.search import Tuner

    from fakes import FakeMeasurer

    Tuner(small, "llvm", FakeMeasurer(small.graph), TuningLog(tmp_path), TuneConfig(trials=2, finalize=False)).run()
    assert {r.protocol["threads"] for r in TuningLog(tmp_path).records()} == {cpu_threads()}
