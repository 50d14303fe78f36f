"""Resize and Upsample (autofuse.onnx_resize) against onnxruntime, an implementation of its own
(the interpolation matrices come from ONNX's reference, so checking against that alone would
not test them independently)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import check_against_onnxruntime as check
from onnx_import import import_and_run

from autofuse.importer import run_onnxruntime


def resize_model(shape: tuple[int, ...], opset: int, op: str = "Resize", dtype: int = TensorProto.FLOAT,
                 scales: list[float] | None = None, sizes: list[int] | None = None, **attrs) -> onnx.ModelProto:
    consts = []
    if scales is not None:
        consts.append(numpy_helper.from_array(np.asarray(scales, "float32"), "scales"))
    if sizes is not None:
        consts.append(numpy_helper.from_array(np.asarray(sizes, "int64"), "sizes"))
    if op == "Upsample" or opset == 10:
        names = ["x", "scales"]
    else:
        names = ["x", "", "scales"] if scales is not None else ["x", "", "", "sizes"]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("y", dtype, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ops(w) -> set[str]:
    return {n.op for n in w.graph.nodes}


@pytest.mark.parametrize("mode,coord", [("nearest", "asymmetric"), ("linear", "half_pixel"),
                                        ("linear", "align_corners"), ("cubic", "half_pixel")])
def test_whole_scales_stay_tvm_resize_kernels(tmp_path, mode, coord):
    """scale * in whole: TVM's resize computes it exactly, as a gather (no matmul)."""
    model = resize_model((1, 3, 8, 10), 13, scales=[1, 1, 2, 2], mode=mode, coordinate_transformation_mode=coord)
    w, _ = check(model, tmp_path)
    assert not any("matmul" in k for k in _ops(w)), _ops(w)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_a_scale_that_is_not_out_over_in_maps_coordinates_by_that_scale(tmp_path, mode):
    """0.6 x 10 pixels = 6: ONNX maps through 1 / 0.6, TVM's kernel through 10 / 6 (a
    different image): interpolation matrices."""
    model = resize_model((1, 2, 10, 7), 13, scales=[1, 1, 0.6, 1.5], mode=mode)
    w, got = check(model, tmp_path)
    assert got[0].shape == (1, 2, 6, 10)
    assert any("matmul" in k for k in _ops(w)), _ops(w)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialiased_downsampling(tmp_path, mode):
    check(resize_model((1, 1, 16, 12), 18, sizes=[1, 1, 5, 4], mode=mode, antialias=1), tmp_path)


def test_axes_and_aspect_ratio_policy(tmp_path):
    check(resize_model((1, 3, 12, 20), 18, sizes=[8, 8], axes=[2, 3], keep_aspect_ratio_policy="not_larger",
                       mode="linear"), tmp_path / "not_larger")
    check(resize_model((1, 3, 12, 20), 18, scales=[2.0, 0.5], axes=[3, 2], mode="nearest"), tmp_path / "axes")


def test_opset_10_and_upsample(tmp_path):
    """Resize-10 and Upsample: asymmetric coordinates, nearest rounded down."""
    check(resize_model((1, 2, 5, 6), 10, scales=[1, 1, 2, 3]), tmp_path / "resize10")
    check(resize_model((1, 2, 5, 6), 9, op="Upsample", scales=[1, 1, 2, 2], mode="nearest"), tmp_path / "up9")
    check(resize_model((1, 2, 5, 6), 9, op="Upsample", scales=[1, 1, 2, 2], mode="linear"), tmp_path / "up9lin")


def test_an_integer_image_is_rounded_back(tmp_path):
    model = resize_model((1, 3, 9, 9), 13, dtype=TensorProto.UINT8, scales=[1, 1, 0.7, 0.7], mode="linear")
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 9, 9)).astype("uint8")
    w, feeds, got = import_and_run(model, tmp_path, feeds=[x])
    want = run_onnxruntime(model, w.inputs, feeds)
    assert got[0].dtype == np.uint8
    assert np.abs(got[0].astype(int) - want[0].astype(int)).max() <= 1  # rounding of halves


def run_time_resize_model(mode: str, coord: str = "half_pixel", conv: bool = False) -> onnx.ModelProto:
    """Resizes whose sizes are known only at run time, as Keypoint R-CNN's head has them: the
    rows of x with a positive sum (NonZero: how many is known at run time) upsampled 2x
    ("rows"), and x resized to ceil(t) pixels, t an input ("sized"), then the column of each
    row's largest value (ArgMax % width, the width a size read from the resized shape); the
    picked rows upsampled by a 2x2 stride-2 transposed convolution ("upsampled"). With
    `conv`, x first goes through a convolution: the layout change then runs (TVM's crashed on
    a size as an operand)."""
    inits = {"axes123": np.array([1, 2, 3], np.int64), "zero": np.array(0, np.float32),
             "axis0": np.array([0], np.int64), "scales": np.array([1, 1, 2, 2], np.float32),
             "nc": np.array([1, 2], np.int64), "one": np.array([1], np.int64), "three": np.array(3, np.int64),
             "flat": np.array([1, -1], np.int64),
             "w": np.linspace(-1, 1, 2 * 2 * 9, dtype=np.float32).reshape(2, 2, 3, 3),
             "wt": np.linspace(-1, 2, 2 * 3 * 4, dtype=np.float32).reshape(2, 3, 2, 2)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["img"], pads=[1, 1, 1, 1]) if conv
             else helper.make_node("Identity", ["x"], ["img"]),
             helper.make_node("ReduceSum", ["img", "axes123"], ["sums"], keepdims=0),
             helper.make_node("Greater", ["sums", "zero"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["nz"]),
             helper.make_node("Squeeze", ["nz", "axis0"], ["kept"]),
             helper.make_node("Gather", ["img", "kept"], ["picked"], axis=0),
             helper.make_node("Resize", ["picked", "", "scales"], ["rows"], mode=mode,
                              coordinate_transformation_mode=coord),
             helper.make_node("Ceil", ["t"], ["up"]),
             helper.make_node("Cast", ["up"], ["hw"], to=TensorProto.INT64),
             helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
             helper.make_node("Slice", ["img", "axis0", "one", "axis0"], ["first"]),
             helper.make_node("Resize", ["first", "", "", "sizes"], ["sized"], mode=mode,
                              coordinate_transformation_mode=coord),
             helper.make_node("Shape", ["sized"], ["sized_shape"]),
             helper.make_node("Gather", ["sized_shape", "three"], ["width"], axis=0),
             helper.make_node("Reshape", ["sized", "flat"], ["sized_flat"]),
             helper.make_node("ArgMax", ["sized_flat"], ["pos"], axis=1, keepdims=0),
             helper.make_node("Mod", ["pos", "width"], ["column"]),
             # a 2x2 stride-2 transposed convolution over the picked rows (a keypoint head's)
             helper.make_node("ConvTranspose", ["picked", "wt"], ["upsampled"], strides=[2, 2], kernel_shape=[2, 2])]
    graph = helper.make_graph(
        nodes, "run_time_resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 5, 4]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("sized", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("column", TensorProto.INT64, None),
         helper.make_tensor_value_info("upsampled", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode,coord,conv", [("nearest", "asymmetric", False), ("linear", "half_pixel", False),
                                             ("cubic", "half_pixel", True), ("linear", "align_corners", True)])
def test_resizes_sized_at_run_time_match_onnxruntime(tmp_path, mode, coord, conv):
    from autofuse import apply
    from autofuse import build
    from autofuse.workload import prepare

    model = run_time_resize_model(mode, coord, conv)
    onnx.save(model, tmp_path / "model.onnx")
    w = prepare(tmp_path / "model.onnx", [], simplify=False)
    target = build.make_target("llvm")
    ex = build.build(apply.apply_plan(w.mod, w.graph, w.tvm_default()), target)
    rng = np.random.default_rng(len(mode) + conv)
    for kept, t in [(2, [7.2, 3.5]), (1, [3.0, 9.0]), (3, [1.5, 2.0])]:
        signs = np.array([1.0] * kept + [-1.0] * (3 - kept), np.float32)  # `kept` rows sum above 0
        rng.shuffle(signs)
        x = (np.abs(rng.standard_normal((3, 2, 5, 4))) + 0.05).astype(np.float32) * signs[:, None, None, None]
        feeds = [x, np.array(t, np.float32)]
        got = build.run(ex, build.device_for(target), feeds)
        want = run_onnxruntime(model, w.inputs, feeds)
        assert got[1].shape == (1, 2, *np.ceil(t).astype(int))
        for g, r in zip(got, want):
            assert g.shape == r.shape
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
