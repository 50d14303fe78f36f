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
