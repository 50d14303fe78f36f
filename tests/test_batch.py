"""Remote measurement in batches: export compiled plans, run them with the TVM runtime alone
(in a fresh process, and through TVM RPC on localhost), ingest the results into the log."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from autofuse.batch import BatchError
from autofuse.batch import candidate_plans
from autofuse.batch import export_batch
from autofuse.batch import ingest
from autofuse.build import MeasureConfig
from autofuse.gpu_resources import ResourceLimits
from autofuse.measure import IsolatedMeasurer
from autofuse.space import SearchSpace
from autofuse.tuning_log import TuningLog


def _runner(batch, out, *extra):
    # a fresh interpreter in runtime-only mode, outside the repository: no compiler, no autofuse
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", TVM_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, str(batch / "runner.py"), str(batch), "--out", str(out),
           "--number", "2", "--repeat", "3", "--min-repeat-ms", "1", *extra]
    proc = subprocess.run(cmd, cwd=batch.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def cpu_batch(mlp, tmp_path_factory):
    batch = tmp_path_factory.mktemp("batch") / "mlp"
    plans = candidate_plans(mlp, SearchSpace(mlp.graph), 3, "llvm")
    assert [label for label, _ in plans] == ["unfused", "tvm_default", "tvm_default+reduction"]  # the first seed
    with IsolatedMeasurer(mlp, target="llvm", config=MeasureConfig(timeout_s=300)) as m:
        manifest = export_batch(m, plans, batch, "rules")
    return batch, manifest


def test_export_run_runtime_only_and_ingest(cpu_batch, mlp, tmp_path):
    batch, manifest = cpu_batch
    assert [e["label"] for e in manifest["entries"]][:2] == ["unfused", "tvm_default"]
    assert all((batch / e["library"]).is_file() for e in manifest["entries"])
    results = _runner(batch, tmp_path / "results.json")
    assert [r["status"] for r in results["results"]] == ["ok"] * len(manifest["entries"])
    assert results["protocol"]["in_turns"] and all(len(r["latencies_s"]) == 3 for r in results["results"])
    assert all(r["max_abs_err"] < 1e-4 for r in results["results"])
    assert any(r["kernel_latencies_s"] for r in results["results"])  # kernels timed alone too
    log = TuningLog(tmp_path / "log")
    assert ingest(log, batch, tmp_path / "results.json") == len(manifest["entries"])
    recs = log.records()
    assert [r.role for r in recs] == ["remote"] * len(manifest["entries"]) + ["best"]
    assert all(r.status == "ok" and r.measurement["median_s"] > 0 and r.model_key == mlp.key for r in recs)
    # the batch's decision (tuner's rule: beat tvm_default beyond noise and min gain) is what
    # deployment picks for this target
    from autofuse import deploy

    chosen = deploy.choose_plan(mlp.key, mlp.graph, mlp.tvm_default(), tmp_path / "log", "llvm")
    assert chosen.source == "log" and chosen.plan.key == recs[-1].plan_key
    # the tuner reads remote records like its own: plans measured, kernels learned
    from autofuse.search import TuneConfig
    from autofuse.search import Tuner
    from fakes import FakeMeasurer

    tuner = Tuner(mlp, "llvm", FakeMeasurer(mlp.graph), log, TuneConfig(trials=1), scheduler="rules")
    tuner._load_history()
    assert {e["plan_key"] for e in manifest["entries"]} <= set(tuner.measured)
    assert tuner.kernel_s
    # a second batch re-times the references (unfused, tvm_default, the fastest so far) and
    # fills the rest with plans not timed yet
    again = candidate_plans(mlp, SearchSpace(mlp.graph), 6, "llvm", log)
    timed = {e["plan_key"] for e in manifest["entries"]}
    fastest = min((r for r in recs[:-1]), key=lambda r: r.measurement["median_s"]).plan_key
    assert [label for label, _ in again][:2] == ["unfused", "tvm_default"]
    assert {p.key for _, p in again} & timed == {mlp.unfused().key, mlp.tvm_default().key, fastest}
    assert len(again) == 6


def test_a_broken_library_is_a_result_not_the_end(cpu_batch, tmp_path):
    batch, manifest = cpu_batch
    broken = tmp_path / "broken"
    shutil.copytree(batch, broken)
    (broken / manifest["entries"][0]["library"]).write_bytes(b"not a shared library")
    results = _runner(broken, tmp_path / "r.json")
    statuses = [r["status"] for r in results["results"]]
    assert statuses[0] == "runtime_error" and statuses[1:] == ["ok"] * (len(statuses) - 1)


def test_a_plan_checked_but_not_timed_is_ingested_as_a_timeout(cpu_batch, tmp_path):
    batch, manifest = cpu_batch
    rows = [{"plan_key": e["plan_key"], "label": e["label"], "status": "checked"} for e in manifest["entries"]]
    (tmp_path / "cut.json").write_text(json.dumps({"batch": manifest["batch"], "results": rows}))
    log = TuningLog(tmp_path / "log")
    ingest(log, batch, tmp_path / "cut.json")
    assert {r.status for r in log.records()} == {"timeout"}  # no decision without timings


def test_batch_decision_pairs_samples_taken_in_turns():
    # a slow spell after the first third doubles both plans' times: pooled, the candidate's 5%
    # gain drowns in the spread; paired round by round it is there every time
    from autofuse.batch import _decision
    from autofuse.batch import _record
    from autofuse.measure import Measurement

    manifest = {"model_key": "m", "model_name": "m", "target": "cuda", "scheduler": "dlight", "batch": "b",
                "entries": [{"label": "tvm_default", "plan_key": "d", "plan": {"key": "d"}},
                            {"label": "tvm_default+horizontal", "plan_key": "c", "plan": {"key": "c"}}]}
    default = [1.0] * 5 + [2.0] * 10
    records = [_record(manifest, e, Measurement(e["plan_key"], "ok", latencies_s=tuple(x * f for x in default)), "", {})
               for e, f in zip(manifest["entries"], (1.0, 0.95))]
    assert _decision(manifest, records, 0.02, in_turns=True).plan_key == "c"
    assert _decision(manifest, records, 0.02, in_turns=False).plan_key == "d"


def test_ingest_rejects_results_of_another_batch(cpu_batch, tmp_path):
    batch, _ = cpu_batch
    (tmp_path / "other.json").write_text(json.dumps({"batch": "someone-else", "results": []}))
    with pytest.raises(BatchError, match="not"):
        ingest(TuningLog(tmp_path / "log"), batch, tmp_path / "other.json")
    with pytest.raises(BatchError, match="not found"):
        ingest(TuningLog(tmp_path / "log"), batch, tmp_path / "missing.json")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runner_through_tvm_rpc(cpu_batch, tmp_path):
    batch, manifest = cpu_batch
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port),
         "--port-end", str(port + 1)],
        env=dict(os.environ, TVM_NUM_THREADS="1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # the server serves from a child process: kill them together
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        results = _runner(batch, tmp_path / "rpc.json", "--rpc", f"127.0.0.1:{port}")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    assert [r["status"] for r in results["results"]] == ["ok"] * len(manifest["entries"])
    assert results["host"] == f"127.0.0.1:{port}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_batch_compiles_for_sm90_with_resources(transformer, tmp_path):
    plans = candidate_plans(transformer, SearchSpace(transformer.graph), 3, "cuda")
    cfg = MeasureConfig(timeout_s=300)
    with IsolatedMeasurer(transformer, target="cuda", config=cfg) as m:
        manifest = export_batch(m, plans, tmp_path / "gpu", "dlight")
    assert len(manifest["entries"]) == 3 and not manifest["rejected"]
    for e in manifest["entries"]:
        assert (tmp_path / "gpu" / e["library"]).stat().st_size > 0
        assert e["resources"] and all(r["registers"] > 0 for r in e["resources"].values())
        assert any(g["features"][-3] is not None for g in e["groups"])  # registers as a feature
    with IsolatedMeasurer(transformer, target="cuda", config=cfg, resource_limits=ResourceLimits(max_registers=8)) as m:
        tight = export_batch(m, plans[:1], tmp_path / "tight", "dlight")
    assert not tight["entries"] and tight["rejected"][0]["status"] == "over_limit"
    log = TuningLog(tmp_path / "log")
    (tmp_path / "none.json").write_text(json.dumps({"batch": tight["batch"], "results": []}))
    assert ingest(log, tmp_path / "tight", tmp_path / "none.json") == 1  # the rejection is logged
    assert [r.status for r in log.records()] == ["over_limit"]  # and nothing to decide


def test_gpu_check_script_end_to_end_on_cpu_batches(tmp_path):
    # the same two scripts a GPU run uses, with CPU batches and a runtime-only copy of this
    # machine's TVM trimmed as for the GPU host
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    prep = tmp_path / "prep"
    cmd = [sys.executable, os.path.join(root, "scripts", "prepare_gpu_check.py"), str(prep), "--models", "mlp",
           "--plans", "2", "--target", "llvm", "--space", "default", "--runtime-python", "local",
           "--log-dir", str(tmp_path / "none")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "results"
    env = dict(os.environ, PYTHON=sys.executable, DEVICE="cpu", TVM_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(prep / "gpu_check.sh"), str(prep), str(out)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "mlp.json").read_text())
    assert [r["status"] for r in results["results"]] == ["ok", "ok"]
    # the trimmed runtime copy in the folder ran it, not the installed TVM
    assert results["runtime"] == str(prep.resolve() / "runtime" / "tvm")
    log = TuningLog(tmp_path / "log")
    assert ingest(log, prep / "batches" / "mlp", out / "mlp.json") == 2
    bad = subprocess.run(["bash", str(prep / "gpu_check.sh"), str(tmp_path), str(out)], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
