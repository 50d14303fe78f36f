"""Models with sizes known only at run time: a detector's NonMaxSuppression and what follows it.

The kept boxes' count comes from the data; TVM's VM runs such kernels, but autofuse's graph
needed a static shape on every kernel, so such a model failed to import ("symbolic shape ...;
fix the input dimensions", though its inputs were fixed). Those kernels now stand alone; the
rest of the model (the backbone, nearly all of the time) is planned and scheduled as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from tvm import tirx

from autofuse import onnx_nms
from autofuse import plan as plan_rules
from autofuse import tvm_bridge
from autofuse.build import MeasureConfig
from autofuse.importer import InputSpec
from autofuse.importer import load_model
from autofuse.measure import IsolatedMeasurer
from autofuse.space import SearchSpace
from autofuse.workload import prepare
from tests.onnx_import import check_against_onnxruntime
from tests.onnx_import import import_and_run

ANCHORS = 256


def detector(score_threshold: float | None = 0.6, center_point_box: int = 1, most: int = 5,
             iou: bool = True, logits: bool = False, threshold_input: bool = False) -> onnx.ModelProto:
    """conv -> (1, 4 + 4 classes, 256 anchors) as YOLOv8 lays it out -> NonMaxSuppression (at
    most `most` boxes a class; no score threshold if None, no IoU threshold unless `iou`; scores
    the raw `logits`, negative ones too, or their sigmoid) -> the kept boxes, their scores
    (GatherND) and a matmul over the kept boxes; plus an output of static shape beside them.
    With `threshold_input` the score threshold is the model's second input, not a constant."""
    rng = np.random.default_rng(0)
    consts = {
        "w": rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.3,
        "proj": rng.standard_normal((4, 16)).astype("float32"),
        "rows": np.array([1, 8, ANCHORS], "int64"),
        "zero": np.array([0], "int64"), "four": np.array([4], "int64"), "eight": np.array([8], "int64"),
        "axis1": np.array([1], "int64"), "most": np.array([most], "int64"),
        "iou": np.array([0.5], "float32"), "score": np.array([score_threshold or 0.0], "float32"),
        "two": np.array(2, "int64"),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "rows"], ["raw"]),
        helper.make_node("Slice", ["raw", "zero", "four", "axis1"], ["box_rows"]),
        helper.make_node("Transpose", ["box_rows"], ["boxes"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["raw", "four", "eight", "axis1"], ["logits"]),
        helper.make_node("Identity" if logits else "Sigmoid", ["logits"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou" if iou else "",
                                               "score" if score_threshold else ""],
                         ["selected"],
                         center_point_box=center_point_box),
        helper.make_node("Gather", ["selected", "two"], ["anchor"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero"], ["all_boxes"]),
        helper.make_node("Gather", ["all_boxes", "anchor"], ["kept_boxes"], axis=0),
        helper.make_node("GatherND", ["scores", "selected"], ["kept_scores"]),
        helper.make_node("MatMul", ["kept_boxes", "proj"], ["embedded"]),
        helper.make_node("ReduceMax", ["scores", "axis1"], ["best"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("kept_boxes", TensorProto.FLOAT, ["kept", 4]),
         helper.make_tensor_value_info("kept_scores", TensorProto.FLOAT, ["kept"]),
         helper.make_tensor_value_info("embedded", TensorProto.FLOAT, ["kept", 16]),
         helper.make_tensor_value_info("best", TensorProto.FLOAT, [1, ANCHORS])],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if not (threshold_input and k == "score")])
    if threshold_input:
        graph.input.append(helper.make_tensor_value_info("score", TensorProto.FLOAT, [1]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("center_point_box", [0, 1])
def test_kept_boxes_match_onnxruntime_with_some_and_with_none_kept(tmp_path, center_point_box):
    model = detector(center_point_box=center_point_box)
    some = [np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32") * 3]
    none = [np.zeros((1, 3, 16, 16), "float32")]  # every score sigmoid(0) = 0.5, under 0.6
    _, got = check_against_onnxruntime(model, tmp_path / "some", feeds=some)
    assert 0 < got[0].shape[0] <= 4 * 5  # 4 classes, at most 5 boxes each
    _, got = check_against_onnxruntime(model, tmp_path / "none", feeds=none)
    assert got[0].shape == (0, 4) and got[2].shape == (0, 16)


@pytest.mark.parametrize("iou", [True, False])
def test_every_box_a_candidate_and_no_real_maximum(tmp_path, iou):
    """No score threshold on raw logits (negative scores too), the maximum torchvision exports
    (INT64_MAX), with and without an IoU threshold (ONNX's default: 0, any overlap suppresses):
    every box is sorted and suppressed against, and the padded output has a row per box and
    class, not 2^63."""
    model = detector(score_threshold=None, most=2**63 - 1, iou=iou, logits=True)
    feeds = [np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype("float32") * 3]
    _, got = check_against_onnxruntime(model, tmp_path, feeds=feeds)
    assert got[0].shape[0] > 4 * 5
    assert (got[1] <= 0).any()  # scores at or below zero kept


def test_a_score_threshold_given_at_run_time_is_read_at_run_time(tmp_path):
    model = detector(threshold_input=True)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32") * 3
    counts = []
    for k, threshold in enumerate((0.55, 0.9999)):
        _, got = check_against_onnxruntime(model, tmp_path / str(k), feeds=[x, np.array([threshold], "float32")])
        counts.append(got[0].shape[0])
    assert counts[0] > counts[1]


def test_a_second_stage_on_the_kept_boxes_matches_onnxruntime(tmp_path):
    """RoiAlign over the kept boxes, its batch index made as torchvision exports it (Shape of
    the boxes -> Gather -> ConstantOfShape), then Flatten and a matmul: the batch index had
    an unknown shape, and the Flatten after the RoiAlign failed to import."""
    model = detector(score_threshold=0.2)
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(np.random.default_rng(3).standard_normal((32, 10)).astype("float32"), "fc"),
                          numpy_helper.from_array(np.array([16.0], "float32"), "scale")])
    g.node.extend([
        helper.make_node("Abs", ["kept_boxes"], ["corners"]),
        helper.make_node("Mul", ["corners", "scale"], ["rois"]),
        helper.make_node("Shape", ["rois"], ["roi_shape"]),
        helper.make_node("Gather", ["roi_shape", "zero"], ["roi_count"], axis=0),
        helper.make_node("ConstantOfShape", ["roi_count"], ["image_of_roi"],
                         value=numpy_helper.from_array(np.array([0], "int64"))),
        helper.make_node("RoiAlign", ["r", "rois", "image_of_roi"], ["pooled"], output_height=2, output_width=2,
                         sampling_ratio=2),
        helper.make_node("Flatten", ["pooled"], ["pooled_rows"]),
        helper.make_node("MatMul", ["pooled_rows", "fc"], ["classified"]),
    ])
    g.output.append(helper.make_tensor_value_info("classified", TensorProto.FLOAT, ["kept", 10]))
    feeds = [np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")]
    _, got = check_against_onnxruntime(model, tmp_path, feeds=feeds, tol=1e-4)  # bilinear sums' order
    assert got[-1].shape[0] > 0


def test_a_box_limit_given_at_run_time_is_refused_by_name(tmp_path):
    model = detector()
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "most"))
    model.graph.input.append(helper.make_tensor_value_info("most", TensorProto.INT64, [1]))
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(Exception, match="max_output_boxes_per_class is the model input 'most'"):
        prepare(tmp_path / "m.onnx")
    w = prepare(tmp_path / "m.onnx", [InputSpec.parse("most:1:int64=3")])  # fixed as the error says
    assert any(n.op.startswith("non_max_suppression") for n in w.graph.nodes)


def test_run_time_sized_kernels_stand_alone_and_every_seed_plan_builds(tmp_path):
    path = tmp_path / "detector.onnx"
    onnx.save(detector(score_threshold=0.2), path)
    w = prepare(path)
    sized = [n for n in w.graph.nodes if not n.fusable and n.op.startswith(("take", "gather_nd", "matmul"))]
    assert len(sized) >= 3  # the gathers and the matmul after NonMaxSuppression
    static = [n for n in w.graph.nodes if n.op.startswith(("conv2d", "sigmoid", "relu"))]
    assert static and all(n.fusable for n in static)  # the backbone is planned as before
    default = w.tvm_default()
    plans = [w.unfused(), default, *SearchSpace(w.graph).plus_kinds(default)]
    for p in plans:
        plan_rules.validate(w.graph, p)
    assert any(len(g) > 1 for g in default.groups)
    with IsolatedMeasurer(w, config=MeasureConfig(timeout_s=300, repeat=2)) as m:
        results = m.measure_together(plans, time_groups=True)
    assert [r.status for r in results] == ["ok"] * len(plans), [r.error for r in results]
    # the static kernels still timed alone for the cost model (one run-time sized kernel among
    # them had lost every kernel's time)
    assert len(results[1].kernel_latencies_s) >= len(static)



def class_filter(best: int, detections: int | None = None) -> onnx.ModelProto:
    """A torchvision detector's post-processing for one class, as its ONNX export writes it:
    the scores over 0.6 (NonZero, GatherND), the best min(`best`, candidates) of them (TopK
    with k = ReduceMin(Concat(best, Shape(candidates)[0]))), and If ReduceProd(Shape(boxes))
    == 0 then no box else NonMaxSuppression over them (torchvision's batched_nms, its class
    offsets sliced "to the end"). TVM's frontend refused a shape as ReduceMin's input, took only a
    constant k, typed the If's result by its rank alone, and the offsets' column by a length it
    could not compare with the boxes'. With `detections`, the kept boxes are cut to that many
    first (torchvision's `keep[:detections_per_img]`)."""
    rng = np.random.default_rng(0)
    consts = {
        "w": rng.standard_normal((5, 3, 3, 3)).astype("float32") * 0.3,
        "rows": np.array([5, ANCHORS], "int64"), "zero": np.array([0], "int64"), "four": np.array([4], "int64"),
        "five": np.array([5], "int64"), "axis0": np.array([0], "int64"), "perm_k": np.array([1], "int64"),
        "best": np.array([best], "int64"), "threshold": np.array(0.6, "float32"), "most": np.array([100], "int64"),
        "iou": np.array([0.5], "float32"), "scalar0": np.array(0, "int64"), "two": np.array(2, "int64"),
        "one": np.array(1.0, "float32"), "nought": np.array(0.0, "float32"), "to_end": np.array([2**63 - 1], "int64"),
    }
    empty = helper.make_node("Constant", [], ["none"], value=numpy_helper.from_array(np.zeros(0, "int64")))
    suppress = [  # torchvision's batched_nms: each class's boxes offset by class x (max coordinate + 1)
        helper.make_node("ReduceMax", ["top_boxes"], ["max_coordinate"], keepdims=0),
        helper.make_node("Add", ["max_coordinate", "one"], ["spacing"]),
        helper.make_node("Mul", ["top_scores", "nought"], ["box_class"]),  # every box of class 0
        helper.make_node("Mul", ["box_class", "spacing"], ["offsets"]),
        helper.make_node("Slice", ["offsets", "zero", "to_end", "zero"], ["all_offsets"]),  # offsets[:, None]
        helper.make_node("Unsqueeze", ["all_offsets", "perm_k"], ["offset_column"]),
        helper.make_node("Add", ["top_boxes", "offset_column"], ["boxes_for_nms"]),
        helper.make_node("Unsqueeze", ["boxes_for_nms", "axis0"], ["nms_boxes"]),
        helper.make_node("Unsqueeze", ["top_scores", "axis0"], ["nms_scores1"]),
        helper.make_node("Unsqueeze", ["nms_scores1", "axis0"], ["nms_scores"]),
        helper.make_node("NonMaxSuppression", ["nms_boxes", "nms_scores", "most", "iou"], ["selected"]),
        helper.make_node("Gather", ["selected", "two"], ["kept"], axis=1),
    ]
    kept = "keep_all" if detections else "keep"  # the If's result, sliced to "keep" with `detections`
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "rows"], ["raw"]),
        helper.make_node("Slice", ["raw", "zero", "four"], ["box_rows"]),
        helper.make_node("Transpose", ["box_rows"], ["boxes"], perm=[1, 0]),
        helper.make_node("Slice", ["raw", "four", "five"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["score_row"]),
        helper.make_node("Squeeze", ["score_row", "axis0"], ["scores"]),
        helper.make_node("Greater", ["scores", "threshold"], ["over"]),
        helper.make_node("NonZero", ["over"], ["where"]),
        helper.make_node("Transpose", ["where"], ["where_t"], perm=[1, 0]),
        helper.make_node("GatherND", ["scores", "where_t"], ["candidate_scores"]),
        helper.make_node("GatherND", ["boxes", "where_t"], ["candidate_boxes"]),
        helper.make_node("Shape", ["candidate_scores"], ["candidate_shape"]),
        helper.make_node("Gather", ["candidate_shape", "scalar0"], ["candidates"], axis=0),
        helper.make_node("Unsqueeze", ["candidates", "axis0"], ["candidates1"]),
        helper.make_node("Concat", ["best", "candidates1"], ["limits"], axis=0),
        helper.make_node("ReduceMin", ["limits"], ["k0"], keepdims=0),
        helper.make_node("Reshape", ["k0", "perm_k"], ["k"]),
        helper.make_node("TopK", ["candidate_scores", "k"], ["top_scores", "top"]),
        helper.make_node("Gather", ["candidate_boxes", "top"], ["top_boxes"], axis=0),
        helper.make_node("Shape", ["top_boxes"], ["top_shape"]),
        helper.make_node("ReduceProd", ["top_shape"], ["numel"], keepdims=0),
        helper.make_node("Equal", ["numel", "scalar0"], ["no_box"]),
        helper.make_node("If", ["no_box"], [kept],
                         then_branch=helper.make_graph([empty], "then", [], [
                             helper.make_tensor_value_info("none", TensorProto.INT64, [0])]),
                         else_branch=helper.make_graph(suppress, "else", [], [
                             helper.make_tensor_value_info("kept", TensorProto.INT64, ["n"])])),
        *([helper.make_node("Slice", ["keep_all", "zero", "limit"], ["keep"])] if detections else []),
        helper.make_node("Gather", ["top_boxes", "keep"], ["kept_boxes"], axis=0),
        helper.make_node("Gather", ["top_scores", "keep"], ["kept_scores"], axis=0),
    ]
    if detections:
        consts["limit"] = np.array([detections], "int64")
    graph = helper.make_graph(
        nodes, "class_filter", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("kept_boxes", TensorProto.FLOAT, ["m", 4]),
         helper.make_tensor_value_info("kept_scores", TensorProto.FLOAT, ["m"])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("best, shared_out", [(10, False), (1000, False), (1000, True)])
def test_a_class_filter_with_a_run_time_k_and_a_no_box_branch_matches_onnxruntime(tmp_path, monkeypatch, best,
                                                                                   shared_out):
    """More candidates than `best` (k = best), fewer (k = their number), and none (the If's
    empty branch); with `shared_out`, each kept box's comparisons run on all threads (as from
    onnx_nms.PARALLEL_FROM candidates of one class)."""
    if shared_out:
        monkeypatch.setattr(onnx_nms, "PARALLEL_FROM", 0)
    model = class_filter(best)
    some = [np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32") * 3]
    w, got = check_against_onnxruntime(model, tmp_path / "some", feeds=some)
    assert f', {best}, -1, "both"' in w.mod.script()  # the best `best`, not every candidate sorted
    assert 0 < got[0].shape[0] <= min(best, ANCHORS) and got[0].shape[1] == 4
    none = [np.zeros((1, 3, 16, 16), "float32")]  # every score sigmoid(0) = 0.5, under 0.6
    _, got = check_against_onnxruntime(model, tmp_path / "none", feeds=none)
    assert got[0].shape == (0, 4) and got[1].shape == (0,)


def test_convolutions_go_channels_last_in_a_model_with_an_if(tmp_path):
    """The ops before and after an If sit in dataflow blocks of their own; TVM's layout pass over
    the whole function refused the one with the slice of the If's result ("DataflowBlock Pass
    should not rewrite or delete any global-scope Var"), and SSDlite's convolutions stayed
    channels-first. Each block with convolutions is now converted alone."""
    model = class_filter(10, detections=5)
    w, got = check_against_onnxruntime(model, tmp_path, feeds=[
        np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32") * 3])
    assert 0 < got[0].shape[0] <= 5
    assert not [n for n in w.loaded.notes if "channels-last" in n]
    assert "conv2d_nhwc" in w.mod.script()


def test_top_k_before_opset_10_still_takes_k_from_its_attribute(tmp_path):
    """autofuse's TopK converter (a k computed at run time) replaces TVM's; opset 9's TopK, with k
    an attribute and one input, still goes to TVM's own."""
    graph = helper.make_graph([helper.make_node("TopK", ["x"], ["v", "i"], k=3)], "top3",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 10])],
                              [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    _, got = check_against_onnxruntime(model, tmp_path, feeds=[np.random.default_rng(0).random((2, 10), "float32")])
    assert got[1].shape == (2, 3)


def test_a_run_time_k_is_bounded_only_by_a_modest_constant():
    """min(1000, n) keeps the best 1000; n alone, or a bound too large to allocate, sorts all."""
    from autofuse.onnx_sizes import MAX_TOP_K
    from autofuse.onnx_sizes import _largest

    n = tirx.Var("n", "int64")
    assert _largest(tirx.min(tirx.IntImm("int64", 1000), n)) == 1000
    assert _largest(n) is None
    assert _largest(tirx.min(tirx.IntImm("int64", MAX_TOP_K + 1), n)) is None


@pytest.mark.parametrize("op", ["Sub", "Add", "Mul", "Div", "Mod", "Greater", "Less", "GreaterOrEqual",
                                "LessOrEqual"])
def test_arithmetic_of_a_size_and_a_scalar_tensor_keeps_the_scalar_rank(tmp_path, op):
    # Mask R-CNN's image padding, ceil(h / 32) * 32 - h with h read from a shape: TVM's converters
    # made the size a [1] tensor, the result [1] where ONNX has a scalar, and the Concat of such
    # values unsqueezed failed to import ("Concat expects all input tensors to have same ndim").
    # A comparison of a size failed to import ("Cannot use and / or / not operator to Expr")
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Cast", ["m"], ["mi"], to=TensorProto.INT64),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["h"], axis=0),
             helper.make_node(op, ["mi", "h"], ["d"]),
             helper.make_node("Cast", ["d"], ["di"], to=TensorProto.INT64),  # (a comparison's bool)
             helper.make_node("Unsqueeze", ["di", "zero"], ["u"]),
             helper.make_node("Concat", ["seven", "u"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                              [numpy_helper.from_array(np.array(1, "int64"), "one"),
                               numpy_helper.from_array(np.array([0], "int64"), "zero"),
                               numpy_helper.from_array(np.array([7], "int64"), "seven")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([[3, 9, 1, 4, 2], [8, 0, 6, 5, 7]], "float32")
    _, got = check_against_onnxruntime(model, tmp_path, feeds=[x])
    assert got[0].shape == (2,)


@pytest.mark.parametrize("op", ["Div", "Mul", "Less"])
def test_a_float_size_beside_a_tensor_becomes_a_tensor(tmp_path, op):
    # Mask R-CNN scales each box by 30 / 28, the 28 a static mask's width read from its shape and
    # cast to float: TVM's frontend folds it into a float immediate (a PrimValue), on which its
    # ConvertLayout then segfaulted; it is a 0-d tensor beside the tensor now
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["w"], axis=0),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node(op, ["m", "wf"], ["y"])]
    out_type = TensorProto.BOOL if op == "Less" else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              [numpy_helper.from_array(np.array(1, "int64"), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([[3, 9, 1, 4, 2], [8, 0, 6, 5, 7]], "float32")
    _, got = check_against_onnxruntime(model, tmp_path, feeds=[x])
    assert got[0].shape == ()
    imported = load_model(tmp_path / "model.onnx", simplify=False).mod
    assert not [a for c in tvm_bridge._relax_calls(imported) for a in c.args if isinstance(a, tirx.FloatImm)]


# values of x over 0.5: three of them, none, all (the count NonZero gives, a run-time size)
COUNTS = ([0.9, 0.1, 0.7, 0.2, 0.3, 0.8], [0.1] * 6, [0.9] * 6)
SCORES = np.arange(18, dtype="float32").reshape(6, 3)


def _over_half(nodes: list, out_type: int, scores: bool = True, extra: dict | None = None) -> onnx.ModelProto:
    """A model computing `over` (x > 0.5), `count` and `where` (the number and the indices of x's
    values over 0.5) then `nodes`, whose `y` is its output; with a second input `scores` [6, 3] if
    asked. Constants: i0, i1, three (scalars), v0, v1, flat ([0], [1], [-1]), and `extra`."""
    counting = [helper.make_node("Greater", ["x", "half"], ["over"]),
                helper.make_node("NonZero", ["over"], ["where"]),
                helper.make_node("Shape", ["where"], ["shape"]),
                helper.make_node("Gather", ["shape", "i1"], ["count"], axis=0)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])]
    if scores:
        inputs.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, [6, 3]))
    constants = {"half": np.array(0.5, "float32"), "i0": np.array(0, "int64"), "i1": np.array(1, "int64"),
                 "three": np.array(3, "int64"), "v0": np.array([0], "int64"), "v1": np.array([1], "int64"),
                 "flat": np.array([-1], "int64"), **(extra or {})}
    graph = helper.make_graph(counting + nodes, "g", inputs, [helper.make_tensor_value_info("y", out_type, None)],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _counted(model: onnx.ModelProto, tmp_path, scores: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    """(count, TVM's output) for each of COUNTS, the output checked against onnxruntime's."""
    for x in COUNTS:
        feeds = [np.array(x, "float32")] + ([SCORES] if scores else [])
        _, got = check_against_onnxruntime(model, tmp_path / str(sum(x)), feeds=feeds)
        yield sum(v > 0.5 for v in x), got[0]


def test_a_slice_ending_at_a_run_time_count_is_sized_by_it(tmp_path):
    # torchvision's split of the boxes per image: rows [0, count) of the scores, the count read
    # from the shape of the kept boxes (a run-time size); TVM's Slice left its length unknown
    # and the Reshape after it failed to import (Mask R-CNN's box head)
    model = _over_half([helper.make_node("Unsqueeze", ["count", "v0"], ["counted"]),
                        helper.make_node("Add", ["v0", "counted"], ["end"]),  # after the rows of earlier images
                        helper.make_node("Slice", ["scores", "v0", "end", "v0"], ["kept"]),
                        helper.make_node("Reshape", ["kept", "flat"], ["y"])], TensorProto.FLOAT)
    for count, y in _counted(model, tmp_path):
        assert y.shape == (3 * count,)


def test_a_range_up_to_a_run_time_count_has_the_count_as_its_length(tmp_path):
    # Mask R-CNN picks each detection's mask by label: arange(detections) * 91 + labels. TVM's
    # Range named its length a fresh variable, the Add of it with the labels had no known shape
    model = _over_half([helper.make_node("Range", ["i0", "count", "i1"], ["rows"]),
                        helper.make_node("Mul", ["rows", "three"], ["first"]),
                        helper.make_node("Squeeze", ["where", "v0"], ["picked"]),
                        helper.make_node("Add", ["first", "picked"], ["index"]),
                        helper.make_node("Unsqueeze", ["index", "v0"], ["column"]),
                        helper.make_node("Shape", ["column"], ["size"]),
                        helper.make_node("Reshape", ["column", "size"], ["y"])], TensorProto.INT64, scores=False)
    for count, y in _counted(model, tmp_path, scores=False):
        assert y.shape == (1, count)


def test_a_shape_concatenated_with_sizes_gathered_from_a_shape_is_a_shape(tmp_path):
    # Mask R-CNN reshapes its masks to [detections, ...] from Concat(Shape(x)[:1], Shape(y)[[1]]):
    # TVM's Concat took shapes or tensors, not both, and refused the mix
    model = _over_half([helper.make_node("Unsqueeze", ["count", "v0"], ["end"]),
                        helper.make_node("Slice", ["scores", "v0", "end", "v0"], ["kept"]),
                        helper.make_node("Shape", ["kept"], ["kept_shape"]),
                        helper.make_node("Slice", ["kept_shape", "v0", "v1"], ["rows"]),
                        helper.make_node("Shape", ["scores"], ["score_shape"]),
                        helper.make_node("Gather", ["score_shape", "v1"], ["width"], axis=0),
                        helper.make_node("Concat", ["rows", "width"], ["target"], axis=0),
                        helper.make_node("Reshape", ["kept", "flat"], ["flattened"]),
                        helper.make_node("Reshape", ["flattened", "target"], ["y"])], TensorProto.FLOAT)
    for count, y in _counted(model, tmp_path):
        assert y.shape == (count, 3)


def test_a_slice_from_a_run_time_value_has_its_sizes_named(tmp_path):
    # Mask R-CNN pastes each mask in its box: a slice from a start read from the data, padded
    # with zeros as many as that start (a size read from the data) and as the slice is long (a
    # size read from its shape). TVM typed the slice by rank alone: its Shape was a shape_of the
    # Gather after it refused ("shape_of expects a tensor input"); the zeros had no known shape
    zero = numpy_helper.from_array(np.array([-1.0], "float32"))
    model = _over_half([helper.make_node("Cast", ["over"], ["flags"], to=TensorProto.INT64),
                        helper.make_node("ReduceSum", ["flags"], ["begin"], keepdims=1),
                        helper.make_node("Slice", ["scores", "begin", "six", "v0"], ["tail"]),
                        helper.make_node("Shape", ["tail"], ["tail_shape"]),
                        helper.make_node("Gather", ["tail_shape", "i0"], ["rows"], axis=0),
                        helper.make_node("Gather", ["tail_shape", "v1"], ["width"], axis=0),
                        helper.make_node("Unsqueeze", ["rows", "v0"], ["rows1"]),
                        helper.make_node("Concat", ["rows1", "width"], ["shape_sized"], axis=0),
                        helper.make_node("ConstantOfShape", ["shape_sized"], ["after"], value=zero),
                        helper.make_node("Concat", ["begin", "width"], ["data_sized"], axis=0),
                        helper.make_node("ConstantOfShape", ["data_sized"], ["before"], value=zero),
                        # the last `begin` rows: a negative start counts from the end (-0: all rows)
                        helper.make_node("Neg", ["begin"], ["from_end"]),
                        helper.make_node("Slice", ["scores", "from_end", "huge", "v0"], ["last"]),
                        # rows [begin, 2): none where begin > 2 (an end before the start)
                        helper.make_node("Slice", ["scores", "begin", "two", "v0"], ["early"]),
                        helper.make_node("Concat", ["before", "tail", "after", "last", "early"], ["y"], axis=0)],
                       TensorProto.FLOAT, extra={"six": np.array([6], "int64"), "huge": np.array([2**63 - 1]),
                                                 "two": np.array([2], "int64")})
    results = dict(_counted(model, tmp_path))
    assert all(y.shape == (12 - count + (count or 6) + max(0, 2 - count), 3) for count, y in results.items())
    # and fused as TVM fuses: the same values
    _, _, fused = import_and_run(model, tmp_path, plan="tvm_default",
                                 feeds=[np.array(COUNTS[0], "float32"), SCORES])
    np.testing.assert_array_equal(fused[0], results[3])


def test_a_concat_of_sizes_equal_only_at_run_time_is_typed_by_the_first(tmp_path):
    # Mask R-CNN's loop appends each pasted mask, [1, (its box's expression), ...], to the masks
    # so far, [n, h, w]: TVM cannot prove the sizes off the axis equal, typed the result by rank
    # alone, and no kernel legalised the concat. Here rows [begin, 6) of the scores beside as many
    # rows of zeros, that count computed from the data (6 - begin)
    model = _over_half([helper.make_node("Cast", ["over"], ["flags"], to=TensorProto.INT64),
                        helper.make_node("ReduceSum", ["flags"], ["begin"], keepdims=1),
                        helper.make_node("Slice", ["scores", "begin", "six", "v0"], ["tail"]),
                        helper.make_node("Sub", ["six", "begin"], ["rows"]),
                        helper.make_node("Concat", ["rows", "two"], ["zeros_shape"], axis=0),
                        helper.make_node("ConstantOfShape", ["zeros_shape"], ["zeros"]),
                        helper.make_node("Concat", ["tail", "zeros"], ["y"], axis=1)], TensorProto.FLOAT,
                       extra={"six": np.array([6], "int64"), "two": np.array([2], "int64")})
    for count, y in _counted(model, tmp_path):
        assert y.shape == (6 - count, 5)


def test_a_shape_concatenated_with_a_value_read_from_the_data_is_a_tensor(tmp_path):
    # Concat of a shape with integers that are not sizes (read from the data): a tensor, as ONNX
    # has it (the shape made a tensor of its values), not a shape
    model = _over_half([helper.make_node("Cast", ["over"], ["flags"], to=TensorProto.INT64),
                        helper.make_node("ReduceSum", ["flags"], ["begin"], keepdims=1),
                        helper.make_node("Shape", ["scores"], ["score_shape"]),
                        helper.make_node("Concat", ["score_shape", "begin"], ["joined"], axis=0),
                        helper.make_node("Mul", ["joined", "two"], ["y"])], TensorProto.INT64,
                       extra={"two": np.array(2, "int64")})
    for count, y in _counted(model, tmp_path):
        np.testing.assert_array_equal(y, [12, 6, 2 * count])
