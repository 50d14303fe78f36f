"""Isolated measurement: every outcome class comes back as data, the worker survives."""

import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from autofuse import worker
from autofuse.build import MeasureConfig
from autofuse.measure import IsolatedMeasurer
from autofuse.measure import Measurement
from autofuse.metrics import internal_nodes
from autofuse.metrics import plan_metrics
from autofuse.plan import FusionPlan

FAST = MeasureConfig(number=2, repeat=5, min_repeat_ms=0, timeout_s=120)


@pytest.fixture(scope="module")
def measurer(mlp):
    with IsolatedMeasurer(mlp, config=FAST) as m:
        yield m


def test_ok_measurement_has_latency_and_noise(measurer, mlp):
    r = measurer.measure(mlp.tvm_default())
    assert r.status == "ok", r.error
    assert len(r.latencies_s) == 5 and r.median_s > 0 and r.spread is not None
    assert r.compile_s > 0 and r.max_abs_err < 1e-5
    assert Measurement.from_dict(r.to_dict()) == r


def test_illegal_plan_is_not_built(measurer, small):
    m = IsolatedMeasurer(small)
    plan = FusionPlan.from_groups([[0, 2], [1], [3], [4], [5], [6], [7]])
    r = m.measure(plan)
    assert r.status == "illegal" and r.rule == "convexity" and m._worker is None


def test_timeout_kills_and_replaces_worker(mlp):
    with IsolatedMeasurer(mlp, config=MeasureConfig(timeout_s=0.01)) as m:
        r = m.measure(mlp.unfused())
        assert r.status == "timeout" and "no result" in r.error
        m.config = FAST
        assert m.measure(mlp.unfused()).status == "ok"


def test_worker_death_is_a_build_error(measurer, mlp):
    assert measurer.measure(mlp.unfused()).ok  # worker is up
    pid = measurer._worker.process.pid
    os.kill(pid, signal.SIGSTOP)  # frozen: it cannot answer, then it dies mid-request
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    r = measurer.measure(mlp.tvm_default())
    assert r.status == "build_error" and "died during build" in r.error
    assert measurer.measure(mlp.tvm_default()).ok  # a fresh worker took over


def test_rounds_run_in_fresh_workers(mlp):
    # decision rounds each in their own process: the first round in the worker that was up,
    # every later one in a new worker, which exits cleanly with nothing left behind
    from autofuse.decision import measure_rounds

    with IsolatedMeasurer(mlp, config=FAST) as m:
        pids = []

        def measure_many(plans, config):
            ms = m.measure_together(plans, config=config)
            pids.append(m._worker.process.pid)
            return ms

        rounds = measure_rounds(measure_many, [mlp.tvm_default(), mlp.unfused()], 3, FAST, between=m.restart)
        assert len(rounds.good) == 2 and all(len(v) == 3 for v in rounds.per_round.values())
        assert all(len(m.latencies_s) == 3 * FAST.repeat for m in rounds.good.values())
        assert len(set(pids)) == 3
        old = m._worker.process
        m.restart()
        assert m._worker is None and old.poll() is not None
        # the workers shared one computation of the reference outputs, kept until close
        work_dir = m._work_dir
        assert [p.name[:10] for p in Path(work_dir).iterdir() if p.suffix == ".npz"] == ["reference-"]
        assert len(list((Path(work_dir) / "plans").glob("*.so"))) == 2  # and each plan's one build
    assert not os.path.exists(work_dir)


def test_a_worker_reads_the_reference_outputs_another_computed(mlp, tmp_path):
    from dataclasses import asdict

    inputs = [asdict(s) for s in mlp.inputs]
    first = worker._Session(mlp.mod, inputs, str(tmp_path))
    want = first.ref_outputs("llvm")
    second = worker._Session(mlp.mod, inputs, str(tmp_path))

    def no_compile(*args, **kwargs):
        raise AssertionError("the reference was computed again")

    second.compile = no_compile
    got = second.ref_outputs("llvm")
    assert len(got) == len(want) and all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want))
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("reference-")] == []


def test_a_saved_workload_loads_whole_with_its_weights_kept_apart(mlp, tmp_path):
    import tvm
    from tvm_ffi import structural_equal

    from autofuse import tvm_bridge
    from autofuse.workload import load_module

    mlp.save(tmp_path)
    loaded = load_module(tmp_path)
    assert structural_equal(loaded, mlp.mod) and tvm_bridge.extract_graph(loaded) == mlp.graph
    text = (tmp_path / "module.json").read_text()
    assert len(text) * 2 < len(tvm.ir.save_json(mlp.mod)) and tvm_bridge.WEIGHT_PREFIX in text
    weights = tvm.runtime.load_param_dict((tmp_path / "weights.params").read_bytes())
    assert len(weights) == 6 and all(k.startswith(tvm_bridge.WEIGHT_PREFIX) for k in weights)


def test_a_decision_round_loads_the_plans_an_earlier_worker_built(mlp, tmp_path, monkeypatch):
    from dataclasses import asdict

    from autofuse import build

    inputs = [asdict(s) for s in mlp.inputs]
    req = {**_request(mlp.tvm_default()), "database": None}
    first = worker._Session(mlp.mod, inputs, str(tmp_path))
    built, (ex, *_) = worker._build_and_check(first, req, _Conn(), keep=True)
    assert built["status"] == "ok" and os.path.exists(first.library_path(req))
    assert type(ex).__name__ == "Module"  # the exported library is what gets timed, as deployed
    second = worker._Session(mlp.mod, inputs, str(tmp_path))

    def no_compile(*args, **kwargs):
        raise AssertionError("the plan was compiled again")

    second.compile = no_compile
    loaded, timed = worker._build_and_check(second, req, _Conn(), keep=True)
    assert loaded["status"] == "ok" and loaded["kernels"] == built["kernels"] and timed is not None
    assert loaded["max_abs_err"] < 1e-5
    # another scheduler, another plan: built, not loaded
    assert second.library_path({**req, "scheduler": "none"}) != second.library_path(req)
    # kernels newly tuned by MetaSchedule: what was kept is built again
    monkeypatch.setattr(build, "tune_kernels", lambda *a, **k: 1)
    tuned = worker._tune_kernels(second, {**req, "database": str(tmp_path / "db"), "trials": 1}, _Conn())
    assert tuned["status"] == "ok" and not os.path.exists(second.library_path(req))
    # a workload of large weights is compiled in every round: its library would hold them
    mlp.save(tmp_path)  # its weights: 6 tensors
    monkeypatch.setattr(worker, "KEEP_LIBRARIES_BELOW", (tmp_path / "weights.params").stat().st_size)
    large = worker._Session(mlp.mod, inputs, str(tmp_path))
    assert large.library_path(req) is None and worker._build_and_check(large, req, _Conn(), keep=True)[1]


def test_build_error_classified(mlp):
    with IsolatedMeasurer(mlp, target='{"kind": "no_such_target"}', config=FAST) as m:
        r = m.measure(mlp.unfused())
    assert r.status == "build_error" and "target" in r.error


class _Conn:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def _session(w):
    from dataclasses import asdict

    return worker._Session(w.mod, [asdict(s) for s in w.inputs])


def _request(plan):
    from dataclasses import asdict

    return {"groups": [list(g) for g in plan.groups], "target": "llvm", "config": asdict(FAST)}


def test_wrong_result_and_runtime_error_classified(mlp):
    session = _session(mlp)
    good = session.ref_outputs("llvm")
    session.reference["llvm"] = [g + 1.0 for g in good]
    conn = _Conn()
    out = worker.handle(session, _request(mlp.tvm_default()), conn)
    assert out["status"] == "wrong_result" and out["max_abs_err"] == pytest.approx(1.0, rel=1e-3)
    assert conn.sent == [("stage", "build"), ("stage", "run")]
    session.reference["llvm"] = good
    session.feeds = [np.zeros((3, 3), dtype="float32")]  # wrong input shape
    out = worker.handle(session, _request(mlp.tvm_default()), _Conn())
    assert out["status"] == "runtime_error"


def test_tolerances_are_dtype_aware():
    assert worker.tolerance("float16")[0] > worker.tolerance("float32")[0]
    assert worker.tolerance("int64") == (0.0, 0.0)
    a = [np.array([1.0, 2.0], dtype="float32")]
    assert worker.compare(a, [a[0] + 1e-7])[0]
    assert not worker.compare(a, [a[0] + 1e-2])[0]
    assert not worker.compare([np.array([1, 2])], [np.array([1, 3])])[0]


def test_small_outputs_are_compared_at_their_outputs_scale():
    # BiT: 1.8e-5 off on a small output of a tensor reaching 4.9 is rounding, and every plan
    # (the unfused one too) had been rejected as wrong; 1% of that scale is not
    want = np.array([4.9, -3.0, 0.05, 0.0, np.inf], dtype="float32")
    assert worker.compare([want + np.array([0, 0, 1.8e-5, 1.8e-5, 0], dtype="float32")], [want])[0]
    assert not worker.compare([want + np.array([0, 0, 0.049, 0, 0], dtype="float32")], [want])[0]
    assert not worker.compare([want + np.array([0, 0, 0, 0.01, 0], dtype="float32")], [want])[0]


def test_a_float16_model_with_float32_outputs_is_compared_at_float16s_tolerance(tmp_path):
    # onnxconverter's keep_io_types: float32 in and out, float16 inside. Two schedules of the
    # same plan differ by float16 rounding (3.9e-3 on BERT), which float32's tolerance rejected
    # for every plan, the unfused one included
    import onnx
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper

    from autofuse.workload import prepare

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float16), name)
               for name, shape in (("w1", (512, 512)), ("w2", (512, 512)), ("gamma", (512,)), ("beta", (512,)))]
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["h", "w1"], ["a"]),
             helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["n"]),
             helper.make_node("MatMul", ["n", "w2"], ["b"]),
             helper.make_node("Softmax", ["b"], ["p"]),
             helper.make_node("Cast", ["p"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 512])], weights)
    path = tmp_path / "half.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    # imported for CUDA, which computes in float16 (CPU targets import it as float32 arithmetic,
    # onnx_float16); measured on this CPU all the same
    w = prepare(path, [], simplify=False, target="cuda")
    assert worker.compute_dtype(n.dtype for n in w.graph.nodes) == "float16"
    with IsolatedMeasurer(w, config=FAST) as m:
        results = m.measure_together([w.unfused(), w.tvm_default()])
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    # the rule itself: float16's tolerance for a float32 output of a float16 computation
    want = np.linspace(-1, 1, 8, dtype="float32")
    assert worker.compare([want + 3.9e-3], [want], "float16")[0]
    assert not worker.compare([want + 3.9e-3], [want], "float32")[0]
    assert not worker.compare([want + 0.1], [want], "float16")[0]


def test_cuda_build_only(transformer):
    with IsolatedMeasurer(transformer, target="cuda", build_only=True, config=FAST) as m:
        r = m.measure(transformer.tvm_default())
    assert r.status == "built" and r.compile_s > 0 and not r.latencies_s


def test_plan_metrics(small):
    g = small.graph
    plan = FusionPlan.from_groups([[0, 1, 2, 3], [4], [5], [6], [7]])
    # relu (1) feeds sum and divide, sum feeds divide, matmul feeds relu: all inside the group
    assert internal_nodes(g, plan) == [0, 1, 2]
    m = plan_metrics(g, plan)
    assert m.kernels == 5 and m.fusion_ratio == pytest.approx(4 / 8)
    assert m.bytes_saved == 128 + 128 + 16
    assert plan_metrics(g, small.unfused()).bytes_saved == 0


def test_measure_together_times_plans_in_one_worker(mlp):
    with IsolatedMeasurer(mlp, config=FAST) as m:
        ms = m.measure_together([mlp.tvm_default(), mlp.unfused()])
        pid = m._worker.process.pid
        assert [x.plan_key for x in ms] == [mlp.tvm_default().key, mlp.unfused().key]
        assert all(x.ok and len(x.latencies_s) == FAST.repeat and x.kernels for x in ms)
        # the unfused plan has more kernels than TVM's
        assert len(ms[1].kernels) > len(ms[0].kernels)
        assert m.measure(mlp.unfused()).ok and m._worker.process.pid == pid
        # with time_groups every kernel of every plan is also timed alone (cost-model data)
        timed = m.measure_together([mlp.tvm_default(), mlp.unfused()], time_groups=True)
        assert all(x.ok and set(x.kernels) <= set(x.kernel_latencies_s) for x in timed)


def test_onnxruntime_takes_its_turns_among_the_plans(mlp, model_dir, tmp_path):
    # onnxruntime timed in the worker, sample by sample between the plans' samples
    with IsolatedMeasurer(mlp, config=FAST) as m:
        ms, ort = m.measure_beside_onnxruntime([mlp.tvm_default(), mlp.unfused()], str(model_dir / "mlp.onnx"))
        assert all(x.ok and len(x.latencies_s) == FAST.repeat for x in ms)
        assert ort.ok and ort.plan_key == "onnxruntime" and len(ort.latencies_s) == FAST.repeat
        assert 0 < ort.median_s < 1
        # one that onnxruntime cannot load is its failure; the plans are timed all the same
        (tmp_path / "junk.onnx").write_bytes(b"not a model")
        ms, ort = m.measure_beside_onnxruntime([mlp.tvm_default()], str(tmp_path / "junk.onnx"))
        assert ms[0].ok and len(ms[0].latencies_s) == FAST.repeat
        assert ort.status == "runtime_error" and ort.error


def test_onnxruntime_is_timed_before_any_plan_runs_in_the_worker(mlp, model_dir, monkeypatch):
    import gc

    # each runtime's waiting threads took a core from the other's next samples when they were
    # timed in turns (the MLP's one-kernel plan: 3.8 us alone, 1,642 us in turns with onnxruntime)
    events = []
    real_sampler, real_build = worker._onnxruntime_sampler, worker._build_and_check

    def sampler(*args):
        take = real_sampler(*args)
        return lambda: events.append("onnxruntime" if not gc.isenabled() else "onnxruntime, collector on") or take()

    monkeypatch.setattr(worker, "_onnxruntime_sampler", sampler)
    monkeypatch.setattr(worker, "_build_and_check", lambda *a, **k: events.append("plan") or real_build(*a, **k))
    monkeypatch.setattr(worker.time, "sleep", lambda s: events.append(f"pause {s}"))
    req = {**_request(mlp.tvm_default()), "op": "together", "plans": [list(map(list, mlp.tvm_default().groups))],
           "onnxruntime": str(model_dir / "mlp.onnx")}
    del req["groups"]
    out = worker.handle(_session(mlp), req, _Conn())
    assert out["results"][0]["status"] == "ok" and len(out["results"][0]["latencies_s"]) == FAST.repeat
    assert len(out["onnxruntime_latencies_s"]) == FAST.repeat
    settle = f"pause {worker.SETTLE_S}"
    # a pause, warm-up samples discarded, the kept ones (the garbage collector off), a pause,
    # then the plans
    assert events[0] == settle and events.index("plan") == len(events) - 1
    assert events[1:-2] == ["onnxruntime"] * (len(events) - 3) and events[-2] == settle
    assert len(events) - 3 > FAST.repeat


def test_measure_together_fails_plans_alone(mlp):
    # a plan that does not build is its own build_error; the others are still timed in turns
    session = _session(mlp)
    good = [list(g) for g in mlp.tvm_default().groups]
    req = {**_request(mlp.tvm_default()), "op": "together", "plans": [good, [[0]], good]}
    out = worker.handle(session, req, _Conn())
    statuses = [r["status"] for r in out["results"]]
    assert statuses == ["ok", "build_error", "ok"]
    assert len(out["results"][0]["latencies_s"]) == FAST.repeat == len(out["results"][2]["latencies_s"])


def test_measure_together_falls_back_to_one_by_one(mlp, monkeypatch):
    # the worker dying (or hanging) on the batch costs the batch, not the plans: each is then
    # measured alone
    with IsolatedMeasurer(mlp, config=FAST) as m:
        real = m._exchange
        sent = []

        def exchange(request, timeout_s):
            sent.append(request.get("op"))
            if request.get("op") == "together":
                return {"status": "runtime_error", "error": "worker process died during run"}
            return real(request, timeout_s)

        monkeypatch.setattr(m, "_exchange", exchange)
        ms = m.measure_together([mlp.tvm_default(), mlp.unfused()])
        assert sent == ["together", None, None] and all(x.ok for x in ms)


def test_a_nan_difference_is_reported_as_nan():
    # max() over differences skips a NaN that comes first: the report read 0 or the next
    # output's difference for an output that was NaN where the reference was a number
    want = [np.ones(3, "float32"), np.ones(2, "float32")]
    ok, worst = worker.compare([np.array([1, np.nan, 1], "float32"), np.array([1, 3], "float32")], want)
    assert not ok and np.isnan(worst)
    ok, worst = worker.compare([np.ones(3, "float32"), np.array([1, 3], "float32")], want)
    assert not ok and worst == 2.0


def test_samples_are_taken_with_the_garbage_collector_off():
    # a baseline timed from Python paid collections of a build's garbage in a few of its samples
    import gc

    from autofuse.baselines import time_callable
    from autofuse.build import no_garbage_collection

    assert gc.isenabled()
    with no_garbage_collection():  # the worker takes onnxruntime's samples in it
        assert not gc.isenabled()
    assert gc.isenabled()
    seen = []
    time_callable(lambda: seen.append(gc.isenabled()), repeat=3, min_repeat_s=0)
    assert seen[-3:] == [False] * 3 and gc.isenabled()


def test_plans_are_timed_beside_tvm_s_plan_when_asked(mlp):
    with IsolatedMeasurer(mlp, config=FAST, pair_with_default=True) as m:
        unfused, default = m.measure(mlp.unfused()), m.measure(mlp.tvm_default())
    for r in (unfused, default):
        assert r.status == "ok", r.error
        assert len(r.default_latencies_s) == len(r.latencies_s) == 5 and r.default_s > 0
        assert Measurement.from_dict(r.to_dict()) == r
    assert 0.5 < default.vs_default < 2.0  # TVM's plan beside itself


def test_pairing_stops_when_tvm_s_plan_kills_the_worker(mlp, monkeypatch):
    m = IsolatedMeasurer(mlp, config=FAST, pair_with_default=True)
    sent = []

    def exchange(request, timeout_s):
        sent.append(dict(request))
        if "paired_with" in request:
            return {"status": "runtime_error", "error": "worker process died during pair", "stage": "pair"}
        return {"status": "ok", "latencies_s": [1e-3] * 5}

    monkeypatch.setattr(m, "_exchange", exchange)
    first, second = m.measure(mlp.unfused()), m.measure(mlp.unfused())
    assert first.ok and second.ok and not first.default_latencies_s
    assert ["paired_with" in r for r in sent] == [True, False, False]  # asked once, then never again


def test_a_trial_in_a_slow_spell_is_timed_again(mlp, monkeypatch):
    # TVM's plan (timed beside each trial) ran 2x slower than its fastest in this worker: the
    # spell changes the ranking too, so the pair is timed once more and the faster take kept
    from autofuse import build

    takes = iter([([1.0], [100.0]), ([3.0], [200.0]), ([1.1], [110.0]), ([4.0], [300.0]), ([5.0], [290.0])])
    calls = []

    def interleaved(executables, dev, feeds, config):
        calls.append(1)
        return next(takes)

    monkeypatch.setattr(build, "time_interleaved", interleaved)
    session = _session(mlp)
    paired = object()
    assert session.time_paired("ex", paired, None, FAST) == ([1.0], [100.0]) and len(calls) == 1
    assert session.time_paired("ex", paired, None, FAST) == ([1.1], [110.0]) and len(calls) == 3
    # slow twice: the faster of the two takes, and no third
    assert session.time_paired("ex", paired, None, FAST) == ([5.0], [290.0]) and len(calls) == 5


def test_a_worker_dies_with_the_process_that_started_it():
    """`timeout` ending a tuning job left its worker timing plans on (worker.die_with_parent)."""
    import subprocess
    import sys
    import time

    child = ("import os, sys, time; from autofuse.worker import die_with_parent; "
             "die_with_parent(int(sys.argv[1])); print(os.getpid(), flush=True); time.sleep(60)")
    parent = ("import os, subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())]); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    os.kill(pid, 0)  # the worker runs
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the worker outlived the process that started it")
