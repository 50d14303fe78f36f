"""Half-precision ONNX models compute in float32 on CPU targets, interface kept (autofuse.onnx_float16)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import import_and_run

from autofuse import onnx_float16
from autofuse.importer import InputSpec
from autofuse.importer import run_onnxruntime
from autofuse.workload import prepare

H = TensorProto.FLOAT16


def half_model(subgraph: bool = False) -> onnx.ModelProto:
    """float16 in and out: a matmul, a float16 constant, ConstantOfShape and a Cast to float16;
    `y` is both an output and the input of another node; `x` is passed straight out as well."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float16), "w")
    shape = numpy_helper.from_array(np.array([4, 16], np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(0.5, np.float16))),
        helper.make_node("Mul", ["a", "c"], ["y"]),
        helper.make_node("Tanh", ["y"], ["t"]),
        helper.make_node("Cast", ["t"], ["t32"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["t32"], ["t16"], to=H),
        helper.make_node("ConstantOfShape", ["shape"], ["one"],
                         value=numpy_helper.from_array(np.array([1], np.float16))),
        helper.make_node("Add", ["t16", "one"], ["z"]),
    ]
    if subgraph:  # an If whose branches hold a float16 constant and read an input from outside
        nodes[-1] = helper.make_node("Add", ["t16", "one"], ["z0"])

        def branch(name: str, k: float) -> onnx.GraphProto:
            return helper.make_graph(
                [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(k, np.float16))),
                 helper.make_node("Mul", ["z0", "k"], ["m"]), helper.make_node("Add", ["m", "x"], ["out"])],
                name, [], [helper.make_tensor_value_info("out", H, [4, 16])])

        nodes += [helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True))),
                  helper.make_node("If", ["cond"], ["z"], then_branch=branch("then", 2.0),
                                   else_branch=branch("else", 3.0))]
    graph = helper.make_graph(
        nodes, "half", [helper.make_tensor_value_info("x", H, [4, 16])],
        [helper.make_tensor_value_info(n, H, [4, 16]) for n in ("z", "y", "x")], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_float32_model_is_returned_untouched():
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["z"])], "f",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 16])], [w])
    plain = helper.make_model(graph)
    up, halves = onnx_float16.upcast(plain)
    assert up is plain and halves == set()  # not even copied


def test_the_upcast_model_keeps_its_interface_and_computes_in_float32():
    for subgraph in (False, True):
        model = half_model(subgraph)
        up, halves = onnx_float16.upcast(model)
        assert halves == {"float16"}
        onnx.checker.check_model(up, full_check=True)
        assert [(v.name, v.type.tensor_type.elem_type) for v in up.graph.input] == [("x", H)]
        assert [(v.name, v.type.tensor_type.elem_type) for v in up.graph.output] == [("z", H), ("y", H), ("x", H)]
        # the only float16 left are the interface and the casts at its edges
        casts = [n for n in up.graph.node if n.op_type == "Cast" and n.attribute[0].i == H]
        assert sorted(n.output[0] for n in casts) == ["y", "z"]
        assert not any(t.data_type == H for t in up.graph.initializer)
        x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float16)
        spec = [InputSpec("x", (4, 16), "float16")]
        got, want = run_onnxruntime(up, spec, [x]), run_onnxruntime(model, spec, [x])
        assert [g.dtype for g in got] == [np.float16] * 3
        np.testing.assert_array_equal(got[2], x)
        for g, r in zip(got, want):
            np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_cpu_workloads_compute_a_float16_model_in_float32_and_cuda_workloads_in_float16(tmp_path):
    path = tmp_path / "half.onnx"
    onnx.save(half_model(), path)
    cpu = prepare(path, [], simplify=False)
    cuda = prepare(path, [], simplify=False, target="cuda")
    assert cpu.loaded.upcast_from == "float16" and cuda.loaded.upcast_from is None
    assert any("computed in float32" in n for n in cpu.loaded.notes)
    # on the CPU float16 is left only where the outputs are cast back to it
    assert {n.dtype for n in cpu.graph.nodes if not n.op.startswith("cast")} == {"float32"}
    assert [n.dtype for n in cuda.graph.nodes if n.op.startswith("matmul")] == ["float16"]
    # x cast in, y and z cast out; the model's Cast of t to float32 has nothing left to do
    assert sum(n.op.startswith("cast") for n in cpu.graph.nodes) == 3
    assert [s.dtype for s in cpu.inputs] == [s.dtype for s in cuda.inputs] == ["float16"]
    assert cpu.key != cuda.key


def test_the_cpu_build_of_a_float16_model_matches_onnxruntime(tmp_path):
    model = half_model(subgraph=False)
    w, feeds, got = import_and_run(model, tmp_path, plan="tvm_default")
    want = run_onnxruntime(model, w.inputs, feeds)
    assert [g.dtype for g in got] == [np.float16] * 3
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_tune_and_apply_a_float16_model_keep_its_interface(tmp_path):
    """`autofuse tune` then `apply`: the library takes and returns float16 like the model."""
    import tvm
    from tvm import relax
    from typer.testing import CliRunner

    from autofuse.cli import app

    path, log_dir, lib = tmp_path / "half.onnx", tmp_path / "logs", tmp_path / "half.so"
    model = half_model()
    onnx.save(model, path)
    for args in (["tune", path, "--log-dir", log_dir, "--trials", 2, "--repeat", 3],
                 ["apply", path, "--log-dir", log_dir, "-o", lib]):
        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        if args[0] == "tune":  # the user is told
            assert "import: float16 arithmetic computed in float32" in result.stdout
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float16)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    got = [t.numpy() for t in vm["main"](tvm.runtime.tensor(x))]
    want = run_onnxruntime(model, [InputSpec("x", (4, 16), "float16")], [x])
    assert [g.dtype for g in got] == [np.float16] * 3
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_agreement_with_onnxruntime_allows_for_its_float16_rounding(tmp_path):
    """The CPU import computes in float32; onnxruntime rounds to float16 between operators: the
    check compares at float16's tolerance, and still catches a real difference."""
    from autofuse.baselines import onnxruntime_agreement
    from autofuse.measure import IsolatedMeasurer

    path = tmp_path / "half.onnx"
    onnx.save(half_model(), path)
    w = prepare(path, [], simplify=False)
    with IsolatedMeasurer(w) as m:
        feeds, outputs = m.reference_outputs()
    dtypes = [n.dtype for n in w.graph.nodes]
    assert onnxruntime_agreement(w.loaded, dtypes, outputs, feeds)["match"] is True
    off = [o + np.float16(0.5) for o in outputs]
    assert onnxruntime_agreement(w.loaded, dtypes, off, feeds)["match"] is False
