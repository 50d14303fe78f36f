"""ONNX Loop nodes with a constant trip count are unrolled before import (autofuse.onnx_loop) and
compute what onnxruntime computes from the Loop itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import import_and_run

from autofuse import onnx_loop
from autofuse.importer import ModelError
from autofuse.importer import run_onnxruntime
from autofuse.workload import prepare

F = TensorProto.FLOAT


def loop_model(opset: int, trips: int | None = 4, with_if: bool = False, outer_cond: bool = False) -> onnx.ModelProto:
    """v <- tanh(v * w + i) four times, v's values stacked as a scan output; the condition is
    passed on through an Identity (`outer_cond`: of a constant true of the enclosing graph, as
    TorchScript's exporter writes a `for i in range(x.shape[0])`). `with_if`: the body adds an
    If's result that reads a body value from inside its branches. `trips` None: the count is a
    graph input."""
    body_nodes = [
        helper.make_node("Identity", ["true" if outer_cond else "cond_in"], ["cond_out"]),
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["v", "w"], ["vw"]),
        helper.make_node("Add", ["vw", "fi"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["v_next" if not with_if else "t"]),
    ]
    if with_if:
        def branch(name: str, k: float) -> onnx.GraphProto:
            return helper.make_graph(
                [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(k, np.float32))),
                 helper.make_node("Mul", ["t", "k"], ["b"])], name, [], [helper.make_tensor_value_info("b", F, [2, 3])])

        body_nodes += [helper.make_node("Constant", [], ["flag"], value=numpy_helper.from_array(np.array(True))),
                       helper.make_node("If", ["flag"], ["v_next"], then_branch=branch("then", 0.5),
                                        else_branch=branch("else", 2.0))]
    body_nodes.append(helper.make_node("Identity", ["v_next"], ["scan"]))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), helper.make_tensor_value_info("v", F, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_next", F, [2, 3]), helper.make_tensor_value_info("scan", F, [2, 3])],
        [numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "w")])
    inputs = [helper.make_tensor_value_info("x", F, [2, 3])]
    inits = [numpy_helper.from_array(np.array(True), "cond")]
    if trips is None:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(trips, np.int64), "m"))
    loop = helper.make_node("Loop", ["m", "cond", "x"], ["v_final", "vs"], body=body)
    true = helper.make_node("Constant", [], ["true"], value=numpy_helper.from_array(np.array(True)))
    graph = helper.make_graph([true, loop], "loop", inputs,
                              [helper.make_tensor_value_info("v_final", F, [2, 3]),
                               helper.make_tensor_value_info("vs", F, [trips or 4, 2, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset,outer_cond", [(11, False), (17, False), (17, True)])
def test_unrolled_loops_match_onnxruntime(tmp_path, opset, outer_cond):
    check_unrolled(loop_model(opset, outer_cond=outer_cond), "Loop", [(2, 3), (4, 2, 3)], tmp_path)


def check_unrolled(model: onnx.ModelProto, op: str, shapes: list[tuple[int, ...]], tmp_path) -> None:
    """`model`'s one `op` node is unrolled to a valid model, and imported, it computes outputs of
    `shapes` that match onnxruntime's run of `model` itself."""
    unrolled, count = onnx_loop.unroll(model)
    assert count == 1 and not any(n.op_type == op for n in unrolled.graph.node)
    onnx.checker.check_model(unrolled)
    w, feeds, got = import_and_run(model, tmp_path)
    assert "1 Loop or Scan node(s) of a fixed length unrolled" in w.loaded.notes
    want = run_onnxruntime(model, w.inputs, feeds)
    assert [g.shape for g in got] == shapes
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_subgraphs_in_an_unrolled_body_read_their_own_iteration(tmp_path):
    # the If's branches read the body's `t` by name: each copy must read its iteration's `t`
    # (compared in onnxruntime: TVM imports an If outside any dataflow block, unfusable)
    model = loop_model(17, with_if=True)
    unrolled, _ = onnx_loop.unroll(model)
    x = [np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)]
    spec = [onnx_input("x")]
    for g, r in zip(run_onnxruntime(unrolled, spec, x), run_onnxruntime(model, spec, x)):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def onnx_input(name: str):
    from autofuse.importer import InputSpec

    return InputSpec(name, (2, 3), "float32") if name == "x" else InputSpec(name, (), "int64")


def test_a_loop_whose_condition_is_computed_stays():
    # a while loop in disguise: its condition depends on the iteration, so its count is not known
    model = loop_model(17)
    body = model.graph.node[1].attribute[0].g
    body.node[0].CopyFrom(helper.make_node("Less", ["i", "three"], ["cond_out"]))
    body.initializer.append(numpy_helper.from_array(np.array(3, np.int64), "three"))
    assert onnx_loop.unroll(model) == (model, 0)


def test_a_count_read_from_a_fixed_input_shape_is_unrolled_after_simplification(tmp_path):
    # `for i in range(x.shape[0])` exported with a dynamic first axis: Shape -> Gather -> Loop
    from autofuse import apply
    from autofuse import build
    from autofuse.importer import random_inputs

    model = loop_model(17, trips=2)
    graph = model.graph
    del graph.initializer[1]  # the constant count
    graph.node.insert(0, helper.make_node("Shape", ["x"], ["shape"]))
    graph.node.insert(1, helper.make_node("Gather", ["shape", "zero"], ["m"], axis=0))
    graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
    graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    path = tmp_path / "loop.onnx"
    onnx.save(model, path)
    assert onnx_loop.unroll(model)[1] == 0  # not before the shapes are fixed
    w = prepare(path, [onnx_input("x")])
    assert "1 Loop or Scan node(s) of a fixed length unrolled" in w.loaded.notes
    target = build.make_target("llvm")
    feeds = random_inputs(w.inputs)
    got = build.run(build.build(apply.apply_plan(w.mod, w.graph, w.unfused()), target), build.device_for(target), feeds)
    for g, r in zip(got, run_onnxruntime(model, w.inputs, feeds)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def scan_model(opset: int, length: int | str = 5) -> onnx.ModelProto:
    """A recurrence as older exporters write it: h <- tanh(h * w + x_t + y_t) over 5 steps, x
    scanned forward along axis 1, y backward along axis 0; the states are stacked forward along
    axis 1 and, as h * 2, backward along axis 0. `length` a name: x's and y's scanned axis is
    dynamic (fixed by the importer)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["h", "w"], ["hw"]),
         helper.make_node("Add", ["hw", "xt"], ["a"]),
         helper.make_node("Add", ["a", "yt"], ["b"]),
         helper.make_node("Tanh", ["b"], ["h_next"]),
         helper.make_node("Identity", ["h_next"], ["out1"]),
         helper.make_node("Add", ["h_next", "h_next"], ["out2"])],
        "body",
        [helper.make_tensor_value_info(n, F, [2, 3]) for n in ("h", "xt", "yt")],
        [helper.make_tensor_value_info(n, F, [2, 3]) for n in ("h_next", "out1", "out2")],
        [numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "w")])
    scan = helper.make_node("Scan", ["h0", "x", "y"], ["h_final", "hs", "hs2"], body=body, num_scan_inputs=2,
                            scan_input_axes=[1, 0], scan_input_directions=[0, 1],
                            scan_output_axes=[1, -3], scan_output_directions=[0, 1])
    graph = helper.make_graph(
        [scan], "scan",
        [helper.make_tensor_value_info("h0", F, [2, 3]), helper.make_tensor_value_info("x", F, [2, length, 3]),
         helper.make_tensor_value_info("y", F, [length, 2, 3])],
        [helper.make_tensor_value_info("h_final", F, [2, 3]), helper.make_tensor_value_info("hs", F, [2, 5, 3]),
         helper.make_tensor_value_info("hs2", F, [5, 2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [11, 17])
def test_unrolled_scans_match_onnxruntime(tmp_path, opset):
    check_unrolled(scan_model(opset), "Scan", [(2, 3), (2, 5, 3), (5, 2, 3)], tmp_path)


def test_a_scan_over_a_dynamic_axis_is_unrolled_once_the_importer_fixes_it(tmp_path):
    from autofuse.importer import InputSpec

    model = scan_model(17, length="steps")
    assert onnx_loop.unroll(model)[1] == 0  # its length is not known yet
    path = tmp_path / "scan.onnx"
    onnx.save(model, path)
    specs = [InputSpec("h0", (2, 3), "float32"), InputSpec("x", (2, 5, 3), "float32"),
             InputSpec("y", (5, 2, 3), "float32")]
    with pytest.raises(ModelError, match=r"unsupported ONNX operator.*Scan"):
        prepare(path, specs, simplify=False)
    w = prepare(path, specs)
    assert "1 Loop or Scan node(s) of a fixed length unrolled" in w.loaded.notes
    assert not any(n.op_type == "Scan" for n in w.loaded.onnx_model.graph.node)
