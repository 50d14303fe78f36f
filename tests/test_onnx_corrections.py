"""Stock converters corrected by autofuse.onnx_corrections, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import check_against_onnxruntime as check


F = TensorProto.FLOAT


def model(nodes: list, inputs: dict[str, tuple], outputs: list[str], opset: int, consts: dict | None = None,
          out_type: int = F) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, F, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, out_type, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in (consts or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("attrs", [
    {"output_shape": [10, 8], "strides": [3, 2]},  # one row and column past the natural output
    {"output_shape": [6, 6], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"output_shape": [5, 5], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
])
def test_conv_transpose_output_shape(tmp_path, attrs):
    w = np.random.default_rng(1).standard_normal((2, 3, 3, 3)).astype("float32")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    check(model([node], {"x": (1, 2, 3, 3)}, ["y"], 17, {"w": w}), tmp_path)


def test_layer_normalization_statistics(tmp_path):
    g, b = (np.random.default_rng(k).standard_normal(6).astype("float32") for k in (2, 3))
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv_std"], axis=-1, epsilon=1e-3)
    _, got = check(model([node], {"x": (2, 5, 6)}, ["y", "mean", "inv_std"], 17, {"g": g, "b": b}), tmp_path)
    assert got[1].shape == (2, 5, 1)


@pytest.mark.parametrize("negative,positive", [(1, 0), (0, 1)])
def test_isinf_sides(tmp_path, negative, positive):
    node = helper.make_node("IsInf", ["x"], ["y"], detect_negative=negative, detect_positive=positive)
    x = np.array([[-np.inf, np.inf, 1.0, -2.0, np.nan, np.inf]], "float32")
    check(model([node], {"x": (1, 6)}, ["y"], 20, out_type=TensorProto.BOOL), tmp_path, feeds=[x])


def test_pow_with_an_integer_exponent(tmp_path):
    node = helper.make_node("Pow", ["x", "e"], ["y"])
    check(model([node], {"x": (3, 4)}, ["y"], 15, {"e": np.array(3, "int64")}), tmp_path)


def test_sum_between_convolutions_is_pairwise_adds_in_channels_last(tmp_path):
    """Caffe2's ResNet-50 writes its residual adds as Sum: stacked and reduced, ConvertLayout
    refused it ("Invalid SLayout"); as adds it stays NHWC between the convolutions."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((8, 8, 3, 3)).astype("float32") * 0.1 for _ in range(2))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Sum", ["a", "b", "x"], ["s"]),
             helper.make_node("Mean", ["a", "s"], ["m"]),
             helper.make_node("Max", ["m", "b"], ["c"]),
             helper.make_node("Conv", ["c", "w1"], ["y"], pads=[1, 1, 1, 1])]
    m = model(nodes, {"x": (1, 8, 6, 6)}, ["y"], 13, {"w1": w1, "w2": w2})
    w, _ = check(m, tmp_path)
    assert not any("stack" in n.op for n in w.graph.nodes)
    # every transpose is of the model's NCHW input or to its NCHW output: the adds between
    # the convolutions run channels-last
    nchw = [n for n in w.graph.nodes if "transpose" in n.op]
    assert all(n.shape in ((1, 6, 6, 8), (1, 8, 6, 6)) for n in nchw)
    assert sum(n.shape == (1, 8, 6, 6) for n in nchw) == 1, [(n.op, n.shape) for n in w.graph.nodes]


@pytest.mark.parametrize("to", [TensorProto.INT32, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT64])
def test_cast_from_float_to_integers_wraps_in_few_ops(tmp_path, to):
    # the stock converter's wrap-around (an int64 modulo and a select) made 47 KB kernels that
    # took LLVM 25-35 s each to compile in an int8 OCR model; through int64 it is the same numbers
    from onnx_import import import_and_run

    node = helper.make_node("Cast", ["x"], ["y"], to=to)
    x = np.array([[0.5, -1.7, 300.2, -200.9, 2.0 ** 31 + 5, -(2.0 ** 33), np.inf, np.nan]], "float32")
    w, _, got = import_and_run(model([node], {"x": x.shape}, ["y"], 13, out_type=to), tmp_path, feeds=[x])
    dtype = helper.tensor_dtype_to_np_dtype(to)
    want = np.where(np.isfinite(x), x, 0).astype(np.int64).astype(dtype)  # numpy's wrap-around
    np.testing.assert_array_equal(got[0], want)
    assert "floor_mod" not in w.mod.script() and "bitwise_and" not in w.mod.script()


def reference(m: onnx.ModelProto, feeds: list) -> list:
    from onnx.reference import ReferenceEvaluator

    names = [i.name for i in m.graph.input]
    return ReferenceEvaluator(m).run(None, dict(zip(names, feeds)))


@pytest.mark.parametrize("dtype,block,axis", [
    (TensorProto.INT8, 4, 0),  # 10 rows: two blocks of 4 and a partial one of 2
    (TensorProto.UINT8, 3, 1),
    (TensorProto.INT4, 4, 0),  # a 4-bit weight: dequantized at import
    (TensorProto.UINT4, 2, 1),
])
def test_blocked_dequantize_linear_of_a_weight(tmp_path, dtype, block, axis):
    """A blocked-quantized weight (opset 21's block_size: one scale and zero point per block of
    the axis, as 4-bit weight quantizers write them) dequantized and multiplied by the input."""
    from onnx_import import import_and_run

    rng = np.random.default_rng(0)
    low, high = {TensorProto.INT8: (-128, 127), TensorProto.UINT8: (0, 255),
                 TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15)}[dtype]
    shape = (10, 6)
    blocks = [-(-n // block) if i == axis else n for i, n in enumerate(shape)]
    q = rng.integers(low, high + 1, shape)
    zero = rng.integers(low, high + 1, blocks)
    scale = rng.uniform(0.01, 0.1, blocks).astype("float32")
    consts = [helper.make_tensor("q", dtype, shape, q.reshape(-1).tolist()),
              helper.make_tensor("zero", dtype, blocks, zero.reshape(-1).tolist()),
              numpy_helper.from_array(scale, "scale")]
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["w"], axis=axis, block_size=block),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3, 10])],
                              [helper.make_tensor_value_info("y", F, None)], consts)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    w, feeds, got = import_and_run(m, tmp_path)
    np.testing.assert_allclose(got[0], reference(m, feeds)[0], rtol=1e-5, atol=1e-5)
    folded = any("evaluated at import" in n for n in w.loaded.notes)
    assert folded == (dtype in (TensorProto.INT4, TensorProto.UINT4))


@pytest.mark.parametrize("dtype", [TensorProto.INT8, TensorProto.UINT8, TensorProto.UINT16])
def test_blocked_quantize_linear_rounds_half_to_even_and_saturates(tmp_path, dtype):
    """QuantizeLinear with block_size on a tensor known at run time, then dequantized again:
    halves round to even, values past the type's range saturate."""
    from onnx_import import import_and_run

    rng = np.random.default_rng(1)
    scale = np.array([[0.5, 0.25, 1.0], [2.0, 0.5, 0.125]], "float32")  # 2 x (6 / block 2)
    zero = rng.integers(0, 4, (2, 3))
    consts = [numpy_helper.from_array(scale, "scale"), helper.make_tensor("zero", dtype, [2, 3], zero.reshape(-1).tolist())]
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1, block_size=2),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], axis=1, block_size=2)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 6])],
                              [helper.make_tensor_value_info("y", F, None)], consts)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.array([[0.25, 0.75, -0.125, 0.375, 2.5, -3.5], [300.0, -300.0, 1.25, 0.75, 0.1875, 0.0625]], "float32")
    _, feeds, got = import_and_run(m, tmp_path, feeds=[x])
    np.testing.assert_array_equal(got[0], reference(m, feeds)[0])


def test_a_four_bit_tensor_computed_at_run_time_is_refused_by_name(tmp_path):
    """A 4-bit value at run time (TVM has no such type) is named up front, as a float8 cast is
    (TVM's float8 casts differ from ONNX's: saturation, NaN, the FNUZ variants)."""
    from autofuse.importer import ModelError
    from autofuse.workload import prepare

    consts = [numpy_helper.from_array(np.array(0.5, "float32"), "scale"),
              helper.make_tensor("zero", TensorProto.INT4, [], [1])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 6])],
                              [helper.make_tensor_value_info("y", F, None)], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match=r"unsupported element type\(s\): constant zero \(int4\)"):
        prepare(tmp_path / "m.onnx", [], simplify=False)


def test_a_float8_cast_is_refused_by_name(tmp_path):
    from autofuse.importer import ModelError
    from autofuse.workload import prepare

    nodes = [helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E4M3FNUZ, name="to_fp8"),
             helper.make_node("Cast", ["q"], ["y"], to=F)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 6])],
                              [helper.make_tensor_value_info("y", F, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match=r"to_fp8 \(Cast to float8e4m3fnuz\)"):
        prepare(tmp_path / "m.onnx", [], simplify=False)
