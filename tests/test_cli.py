"""The autofuse command: error paths, tune -> apply -> load-and-run, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from typer.testing import CliRunner

from autofuse.cli import app
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.tuning_log import TuningLog

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def assert_one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("autofuse: error:"), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def tuned(model_dir, tmp_path_factory):
    """One real tuning run of the small MLP, shared by the tests below."""
    log_dir = tmp_path_factory.mktemp("logs")
    model = model_dir / "mlp.onnx"
    result = invoke("tune", model, "--log-dir", log_dir, "--trials", 6, "--repeat", 3, "--json")
    assert result.exit_code == 0, result.output
    return model, log_dir, json.loads(result.stdout)


def test_tune_summary(tuned):
    _, log_dir, summary = tuned
    assert summary["latency_s"]["tvm_default"] > 0 and summary["latency_s"]["unfused"] > 0
    assert summary["latency_s"]["best"] <= summary["latency_s"]["tvm_default"] * 1.0 or not summary["replaced_tvm_default"]
    assert summary["kernels"]["unfused"] == 13
    # the imported model was checked against onnxruntime itself, not only plans against it
    assert summary["onnxruntime_check"]["match"] is True and summary["onnxruntime_check"]["max_diff"] < 1e-4
    recs = TuningLog(log_dir).records()
    assert sum(r.role == "best" for r in recs) == 1
    assert any(r.groups and r.groups[0]["kernel"] for r in recs)


def test_apply_exports_library_that_matches_onnxruntime(tuned, tmp_path):
    import tvm
    from tvm import relax

    model, log_dir, _ = tuned
    out = tmp_path / "mlp.so"
    result = invoke("apply", model, "--log-dir", log_dir, "-o", out)
    assert result.exit_code == 0, result.output
    assert "cached plan" in result.stdout
    from autofuse.importer import InputSpec

    spec = [InputSpec("x", (8, 64))]
    feeds = random_inputs(spec, seed=5)
    want = run_onnxruntime(onnx.load(str(model)), spec, feeds)[0]
    lib = tvm.runtime.load_module(str(out))
    vm = relax.VirtualMachine(lib, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(feeds[0])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_show_and_bench(tuned):
    model, log_dir, _ = tuned
    result = invoke("show", "--log-dir", log_dir)
    assert result.exit_code == 0 and "best plan" in result.stdout and "kernel time" in result.stdout
    result = invoke("bench", model, "--log-dir", log_dir, "--repeat", 3, "--rounds", 2, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = {r["name"]: r for r in data["results"]}
    assert set(rows) == {"unfused", "tvm_default", "autofuse", "onnxruntime"}
    assert 2 <= data["rounds"] <= 4 and data["slow_rounds"] <= data["rounds"] - 2
    assert all(r["median_s"] > 0 and r["spread"] is not None for r in rows.values())
    # each plan's median in each round kept (each a fresh worker process)
    kept = data["rounds"] - data["slow_rounds"]
    assert all(len(rows[n]["per_round_s"]) == kept and min(rows[n]["per_round_s"]) > 0
               for n in ("unfused", "tvm_default", "autofuse"))
    # onnxruntime's samples come from the same workers as the plans': its ratio is paired by round
    assert rows["onnxruntime"]["vs_tvm_default"] > 0


def test_apply_falls_back_or_fails_when_strict(model_dir, tmp_path):
    out = tmp_path / "m.so"
    result = invoke("apply", model_dir / "mlp.onnx", "--log-dir", tmp_path / "empty", "-o", out)
    assert result.exit_code == 0 and out.exists()
    assert "using TVM's default fusion" in result.stderr
    result = invoke("apply", model_dir / "mlp.onnx", "--log-dir", tmp_path / "empty", "-o", out, "--strict")
    assert_one_line_error(result, "no valid tuned plan")


def test_log_for_another_model_or_target(tuned, model_dir, tmp_path):
    _, log_dir, _ = tuned
    result = invoke("apply", model_dir / "conv_block.onnx", "--log-dir", log_dir, "-o", tmp_path / "x.so")
    assert_one_line_error(result, "holds plans for", "none for conv_block")
    result = invoke("apply", model_dir / "mlp.onnx", "--log-dir", log_dir, "--target", "cuda", "-o", tmp_path / "x.so")
    assert_one_line_error(result, "not on cuda")


def test_bad_inputs_one_line_each(model_dir, tmp_path):
    assert_one_line_error(invoke("tune", tmp_path / "missing.onnx", "--log-dir", tmp_path), "not found")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08garbage" * 20)
    assert_one_line_error(invoke("tune", junk, "--log-dir", tmp_path), "not a valid ONNX model")
    assert_one_line_error(invoke("tune", "--target", "tpu", "--log-dir", tmp_path), "unknown target")
    assert_one_line_error(invoke("tune", "--strategy", "magic", "--log-dir", tmp_path), "unknown strategy")
    assert_one_line_error(invoke("tune", "--space", "nope", "--log-dir", tmp_path), "search-space file not found")
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])])
    dyn = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), dyn)
    assert_one_line_error(invoke("tune", dyn, "--log-dir", tmp_path), "dynamic dimension", "--input x:1x4")
    assert_one_line_error(invoke("tune", dyn, "--input", "x:2xq", "--log-dir", tmp_path), "bad shape")
    custom = helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="ai.custom")
    graph = helper.make_graph([custom], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    bad = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.custom", 1)]), bad)
    assert_one_line_error(invoke("tune", bad, "--log-dir", tmp_path), "unsupported ONNX operator", "frob (Frobnicate")


def test_corrupt_log_is_reported_and_kept(tuned, tmp_path):
    _, log_dir, _ = tuned
    broken = tmp_path / "broken"
    broken.mkdir()
    lines = (log_dir / "records.jsonl").read_text().splitlines()
    text = "\n".join([lines[0], "{not json", *lines[1:]]) + "\n"
    (broken / "records.jsonl").write_text(text)
    assert_one_line_error(invoke("show", "--log-dir", broken), "records.jsonl:2: corrupt log line")
    assert_one_line_error(invoke("tune", "mlp", "--log-dir", broken), "corrupt log line")
    assert (broken / "records.jsonl").read_text() == text  # nothing rewritten


def test_merge_command(tuned, tmp_path):
    _, log_dir, _ = tuned
    n = len(TuningLog(log_dir).records())
    result = invoke("merge", tmp_path / "m", log_dir, log_dir / "records.jsonl")
    assert result.exit_code == 0 and f"merged {n} new records" in result.stdout
    assert_one_line_error(invoke("merge", tmp_path / "m", tmp_path / "nope"), "log not found")


def _cli(*args):
    return [sys.executable, "-m", "autofuse.cli", *map(str, args)]


def test_resume_after_kill(model_dir, tmp_path):
    log_dir = tmp_path / "logs"
    args = ["tune", model_dir / "mlp.onnx", "--log-dir", log_dir, "--trials", 8, "--repeat", 2, "--json"]
    proc = subprocess.Popen(_cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    log = TuningLog(log_dir)
    deadline = time.time() + 240
    while time.time() < deadline and len(log.records()) < 3:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its measurement worker
    proc.wait()
    before = log.records()
    assert 3 <= len(before) < 8
    done = subprocess.run(_cli(*args), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    after = log.records()
    assert [r.id for r in after[: len(before)]] == [r.id for r in before]  # nothing lost or rewritten
    searched = [r for r in after if r.role in ("seed", "search")]
    assert len({r.plan_key for r in searched}) == len(searched)  # no plan measured twice
    import optuna

    from autofuse.search import open_study

    study_name = after[0].study
    study = open_study(None, log_dir, study_name, 0)
    states = [t.state for t in study.trials]
    measured = sum(s in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL) for s in states)
    assert measured >= 8
    assert optuna.trial.TrialState.RUNNING not in states


def test_tune_fails_loudly_when_no_plan_runs(tmp_path):
    # a packed function nobody registered: every plan builds, none runs. The job says so and
    # exits non-zero instead of printing a summary that looks like success
    model = tmp_path / "unrunnable.py"
    model.write_text(
        "from tvm.script import ir as I\n"
        "from tvm.script import relax as R\n\n\n"
        "@I.ir_module\n"
        "class Module:\n"
        "    @R.function\n"
        "    def main(x: R.Tensor((8, 8), 'float32')) -> R.Tensor((8, 8), 'float32'):\n"
        "        with R.dataflow():\n"
        "            a = R.nn.relu(x)\n"
        "            c = R.call_dps_packed('nobody.registered', (a,), out_ty=R.Tensor((8, 8), 'float32'))\n"
        "            d = R.exp(c)\n"
        "            R.output(d)\n"
        "        return d\n"
    )
    result = invoke("tune", model, "--trials", 2, "--log-dir", tmp_path / "logs")
    assert result.exit_code == 1, result.output
    assert "no plan of" in result.stderr and "runtime_error" in result.stderr
    assert TuningLog(tmp_path / "logs").records()  # the failures are kept


def test_tune_names_the_size_of_its_search_space(model_dir, tmp_path):
    from autofuse.space import SearchSpace
    from autofuse.workload import prepare

    space = SearchSpace(prepare(model_dir / "transformer_block.onnx").graph)
    result = invoke("tune", model_dir / "transformer_block.onnx", "--strategy", "rules", "--log-dir", tmp_path)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # rich wraps lines at the terminal's width
    assert f"{len(space)} fusion decisions ({len(space.tied)} search parameters)" in text
