"""ONNX Loops whose count or condition is known only at run time, imported as recursive Relax
functions (autofuse.onnx_loop_function), compute what onnxruntime computes from the Loop itself,
for counts of zero, one and several iterations."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import import_and_run
from test_onnx_loop import loop_model

from autofuse.importer import run_onnxruntime

F = TensorProto.FLOAT


def check(model: onnx.ModelProto, feeds: list, shapes: list[tuple[int, ...]], tmp_path, plan: str = "unfused") -> None:
    """`model` imported and built with `plan` computes outputs of `shapes` on `feeds`, as
    onnxruntime does (its Loop imported as a function, not unrolled)."""
    w, _, got = import_and_run(model, tmp_path, plan=plan, feeds=feeds)
    assert not any("unrolled" in note for note in w.loaded.notes)
    assert any("1 Loop node(s) of a length known only at run time" in note for note in w.loaded.notes)
    want = run_onnxruntime(model, w.inputs, feeds)
    assert [g.shape for g in got] == shapes == [r.shape for r in want]
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_a_loop_counted_at_run_time_matches_onnxruntime(tmp_path, trips):
    # v <- tanh(v * w + i), `trips` times, a model input; v's values stacked as a scan output
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3) * (trips + 1)
    check(loop_model(17, trips=None), [x, np.array(trips, np.int64)], [(2, 3), (trips, 2, 3)], tmp_path)


def test_a_loop_whose_condition_is_computed_in_its_body_runs_until_it_is_false(tmp_path):
    # a while loop: the count (10) is an upper bound, the body stops after i = 2
    model = loop_model(17, trips=10)
    body = model.graph.node[1].attribute[0].g
    body.node[0].CopyFrom(helper.make_node("Less", ["i", "two"], ["cond_out"]))
    body.initializer.append(numpy_helper.from_array(np.array(2, np.int64), "two"))
    model.graph.output[1].type.tensor_type.shape.dim[0].dim_param = "steps"
    x = np.linspace(-2, 1, 6, dtype=np.float32).reshape(2, 3)
    check(model, [x], [(2, 3), (3, 2, 3)], tmp_path)


def detections_model() -> onnx.ModelProto:
    """For each row of x whose sum is positive (how many: NonZero's count, known at run time),
    in order: append 2 * the row to a list that starts empty, add the row to a running total,
    and stack the row's sum plus its number of positive values; then 3 * the list. What
    torchvision's Keypoint R-CNN export does per detection: the loop reads the kept indices, the
    image's values and a size from the enclosing graph, leaves its condition input unread, and
    its list grows by one row per iteration."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["keep_going"], ["cond_out"]),  # cond_in unread, as TorchScript writes it
         helper.make_node("Gather", ["/heads/kept", "i"], ["r"]),  # a name as PyTorch's exporter writes it
         helper.make_node("Gather", ["x", "r"], ["row"], axis=0),
         helper.make_node("Mul", ["row", "two"], ["row2"]),
         # reshaped to [1, width], the width read from x's static shape in the enclosing graph
         helper.make_node("Unsqueeze", ["width", "axis0"], ["width_1"]),
         helper.make_node("Concat", ["one", "width_1"], ["row_shape"], axis=0),
         helper.make_node("Reshape", ["row2", "row_shape"], ["one_row"]),
         helper.make_node("Concat", ["rows", "one_row"], ["rows_next"], axis=0),
         helper.make_node("Add", ["total", "row"], ["total_next"]),
         helper.make_node("ReduceSum", ["row", "axis0"], ["plain_sum"], keepdims=1),
         # plus how many of the row's values are positive: a size the body computes (NonZero)
         helper.make_node("Greater", ["row", "zero"], ["row_positive"]),
         helper.make_node("NonZero", ["row_positive"], ["row_nz"]),
         helper.make_node("Shape", ["row_nz"], ["row_nz_shape"]),
         helper.make_node("Slice", ["row_nz_shape", "one", "two_i"], ["positives"]),
         helper.make_node("Cast", ["positives"], ["positives_f"], to=F),
         helper.make_node("Add", ["plain_sum", "positives_f"], ["row_sum"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("rows", F, ["n", 3]), helper.make_tensor_value_info("total", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("rows_next", F, ["n1", 3]),
         helper.make_tensor_value_info("total_next", F, [3]), helper.make_tensor_value_info("row_sum", F, [1])],
        [numpy_helper.from_array(np.array(2, np.float32), "two"),
         numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array([2], np.int64), "two_i")])
    nodes = [
        helper.make_node("ReduceSum", ["x", "axis1"], ["sums"], keepdims=0),
        helper.make_node("Greater", ["sums", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["nz"]),
        helper.make_node("Squeeze", ["nz", "axis0"], ["/heads/kept"]),
        helper.make_node("Shape", ["/heads/kept"], ["kept_shape"]),
        helper.make_node("Gather", ["kept_shape", "first"], ["count"], axis=0),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "one_i"], ["width"], axis=0),
        helper.make_node("ConstantOfShape", ["empty_shape"], ["empty"],
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
        helper.make_node("Loop", ["count", "", "empty", "total0"], ["rows_out", "total", "row_sums"], body=body),
        helper.make_node("Mul", ["rows_out", "three"], ["y"]),
    ]
    inits = {"axis0": np.array([0], np.int64), "axis1": np.array([1], np.int64), "zero": np.array(0, np.float32),
             "first": np.array(0, np.int64), "empty_shape": np.array([0, 3], np.int64),
             "total0": np.zeros(3, np.float32), "three": np.array(3, np.float32), "keep_going": np.array(True),
             "one_i": np.array(1, np.int64)}
    graph = helper.make_graph(
        nodes, "detections", [helper.make_tensor_value_info("x", F, [5, 3])],
        [helper.make_tensor_value_info("y", F, ["k", 3]), helper.make_tensor_value_info("total", F, [3]),
         helper.make_tensor_value_info("row_sums", F, ["k", 1])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("kept", [0, 1, 4])
def test_a_list_grown_per_detection_matches_onnxruntime(tmp_path, kept):
    rng = np.random.default_rng(kept)
    x = np.abs(rng.standard_normal((5, 3))).astype(np.float32) + 0.1
    x[kept:] *= -1  # rows past `kept` sum below zero
    rng.shuffle(x)
    check(detections_model(), [x], [(kept, 3), (3,), (kept, 1)], tmp_path)


def test_a_run_time_loop_builds_in_tvms_plan_too(tmp_path):
    x = np.array([[1, 2, 3], [-1, -2, -3], [4, 5, 6], [-4, 0, 1], [0, 0, 0.5]], np.float32)
    check(detections_model(), [x], [(3, 3), (3,), (3, 1)], tmp_path, plan="tvm_default")
