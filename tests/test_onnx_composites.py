"""ONNX operators composed from Relax ops (autofuse.onnx_composites) match ONNX's reference
implementation, and onnxruntime where it has the operator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_import import check_against_onnxruntime
from onnx_import import import_and_run

from autofuse.importer import ModelError
from autofuse.importer import run_onnxruntime
from autofuse.importer import unsupported_ops
from autofuse.workload import prepare

F = TensorProto.FLOAT


def one_node(op: str, inputs: dict[str, tuple[int, ...]], out: tuple[int, ...], opset: int,
             consts: dict[str, np.ndarray] | None = None, **attrs) -> onnx.ModelProto:
    """`op` on float32 graph inputs (and constant initializers), one float32 output `y`."""
    consts = consts or {}
    names = [*inputs, *consts]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, F, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", F, list(out))],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(model: onnx.ModelProto, tmp_path, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """TVM's outputs against onnxruntime's, or ONNX's reference implementation where onnxruntime
    lacks the operator (at the model's opset)."""
    assert not unsupported_ops(model)
    tmp_path.mkdir(exist_ok=True)
    w, feeds, got = import_and_run(model, tmp_path)
    try:
        want = run_onnxruntime(model, w.inputs, feeds)
    except Exception as err:  # onnxruntime's NOT_IMPLEMENTED or unknown-opset refusal
        assert "NOT_IMPLEMENTED" in str(err) or "opset" in str(err), err
        want = ReferenceEvaluator(model).run(None, {s.name: x for s, x in zip(w.inputs, feeds)})
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)


@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_activations(tmp_path, alpha):
    check(one_node("Celu", {"x": (4, 33)}, (4, 33), 12, alpha=alpha), tmp_path / "celu")
    check(one_node("Swish", {"x": (4, 33)}, (4, 33), 24, alpha=alpha), tmp_path / "swish")
    check(one_node("SwiGLU", {"a": (4, 33), "b": (4, 33)}, (4, 33), 28, alpha=alpha), tmp_path / "swiglu")


@pytest.mark.parametrize("p,axis", [(2, -1), (1, 0), (2, 1)])
def test_lp_normalization(tmp_path, p, axis):
    check(one_node("LpNormalization", {"x": (3, 5, 7)}, (3, 5, 7), 1, p=p, axis=axis), tmp_path)


def test_lp_normalization_of_a_zero_row_is_zero(tmp_path):
    # row 1 of the input is multiplied by zero: its norm is zero, and so is its output
    model = one_node("LpNormalization", {"x": (2, 4)}, (2, 4), 22, axis=1)
    model.graph.node.insert(0, helper.make_node("Mul", ["x", "zero"], ["x0"]))
    model.graph.node[1].input[0] = "x0"
    model.graph.initializer.append(numpy_helper.from_array(np.array([[1], [0]], np.float32), "zero"))
    _, _, got = import_and_run(model, tmp_path)
    assert np.isfinite(got[0]).all() and not got[0][1].any()
    np.testing.assert_allclose(got[0][0] @ got[0][0], 1.0, rtol=1e-5)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod(tmp_path, exclusive, reverse):
    axis = {"axis": np.array(1, np.int64)}
    check(one_node("CumProd", {"x": (3, 6, 2)}, (3, 6, 2), 26, consts=axis, exclusive=exclusive, reverse=reverse),
          tmp_path)


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(tmp_path, time_axis, batch_axis):
    shape = [5, 4, 3] if time_axis == 0 else [4, 5, 3]
    lens = numpy_helper.from_array(np.array([5, 3, 1, 2], np.int64), "lens")
    model = one_node("ReverseSequence", {"x": tuple(shape)}, tuple(shape), 10, time_axis=time_axis,
                     batch_axis=batch_axis)
    model.graph.node[0].input.append("lens")
    model.graph.initializer.append(lens)
    check(model, tmp_path)


@pytest.mark.parametrize("shape,target,axes", [
    ((3, 10, 7), (6, 11), [1, 2]),  # an even crop, an odd pad
    ((4, 9, 8), (2, 6, 8), None),  # an odd crop, an even crop, unchanged
    ((2, 5, 6), (9, 3), [-1, 1]),  # negative axes, taken in the order given
])
def test_center_crop_pad(tmp_path, shape, target, axes):
    out = list(shape)
    for axis, size in zip(axes if axes is not None else range(len(shape)), target):
        out[axis] = size
    attrs = {"axes": axes} if axes is not None else {}
    check(one_node("CenterCropPad", {"x": shape}, tuple(out), 18,
                   consts={"shape": np.array(target, np.int64)}, **attrs), tmp_path)


@pytest.mark.parametrize("image,block,attrs", [
    ((9, 8), (3, 3), {}),
    ((10, 9), (2, 3), {"strides": [2, 3], "pads": [1, 0, 0, 2], "dilations": [1, 2]}),  # rows no block reaches
    ((12,), (4,), {"strides": [2], "pads": [1, 1]}),
])
def test_col2im(tmp_path, image, block, attrs):
    dims, channels, batch = len(image), 3, 2
    strides = attrs.get("strides", [1] * dims)
    pads = attrs.get("pads", [0] * 2 * dims)
    dilations = attrs.get("dilations", [1] * dims)
    grid = [(image[i] + pads[i] + pads[i + dims] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
            for i in range(dims)]
    x = (batch, channels * int(np.prod(block)), int(np.prod(grid)))
    model = one_node("Col2Im", {"x": x}, (batch, channels, *image), 18,
                     consts={"image": np.array(image, np.int64), "block": np.array(block, np.int64)}, **attrs)
    check(model, tmp_path)


@pytest.mark.parametrize("layout,interleaved,dim,positions", [
    ("4d", 0, 0, True), ("4d", 1, 0, True), ("3d", 0, 8, True), ("3d", 1, 0, False), ("4d", 0, 4, False)])
def test_rotary_embedding(tmp_path, layout, interleaved, dim, positions):
    b, heads, s, head = 2, 3, 5, 16
    half = (dim or head) // 2
    rng = np.random.default_rng(0)
    x_shape = (b, heads, s, head) if layout == "4d" else (b, s, heads * head)
    if positions:
        consts = {"cos": rng.standard_normal((9, half)).astype(np.float32),
                  "sin": rng.standard_normal((9, half)).astype(np.float32),
                  "pos": rng.integers(0, 9, (b, s)).astype(np.int64)}
    else:
        consts = {"cos": rng.standard_normal((b, s, half)).astype(np.float32),
                  "sin": rng.standard_normal((b, s, half)).astype(np.float32)}
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": dim}
    if layout == "3d":
        attrs["num_heads"] = heads
    check(one_node("RotaryEmbedding", {"x": x_shape}, x_shape, 23, consts=consts, **attrs), tmp_path)


@pytest.mark.parametrize("per_channel,auto_pad", [(False, "NOTSET"), (True, "SAME_UPPER")])
def test_conv_integer(tmp_path, per_channel, auto_pad):
    """uint8 activations and int8 weights with zero points, as quantize_dynamic writes them."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8), "w")
    x_zp = numpy_helper.from_array(np.array(7, np.uint8), "x_zp")
    w_zp = numpy_helper.from_array(rng.integers(-3, 3, (6,) if per_channel else ()).astype(np.int8), "w_zp")
    attrs = {"auto_pad": auto_pad} if auto_pad != "NOTSET" else {"pads": [1, 0, 1, 2]}
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], strides=[2, 1], **attrs)
    graph = helper.make_graph([node], "ci", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 9, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [w, x_zp, w_zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    w_, feeds, got = import_and_run(model, tmp_path, feeds=[rng.integers(0, 256, (1, 4, 9, 8)).astype(np.uint8)])
    if per_channel:  # onnxruntime takes one weight zero point only
        want = ReferenceEvaluator(model).run(None, {"x": feeds[0]})
    else:
        want = run_onnxruntime(model, w_.inputs, feeds)
    assert got[0].dtype == np.int32
    np.testing.assert_array_equal(got[0], want[0])


def test_bench_reports_a_model_onnxruntime_cannot_run(tmp_path):
    """SwiGLU at opset 28 runs here but not in onnxruntime 1.32: its row says so, the others stand."""
    import json

    from typer.testing import CliRunner

    from autofuse.cli import app

    path = tmp_path / "swiglu.onnx"
    onnx.save(one_node("SwiGLU", {"a": (4, 33), "b": (4, 33)}, (4, 33), 28), path)
    result = CliRunner().invoke(app, ["bench", str(path), "--log-dir", str(tmp_path / "logs"), "--rounds", "1",
                                      "--repeat", "3", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["tvm_default"]["status"] == "ok" and rows["tvm_default"]["median_s"] > 0
    assert rows["onnxruntime"]["status"] == "error" and "NOT_IMPLEMENTED" in rows["onnxruntime"]["error"]


def test_operators_without_converters_are_evaluated_where_their_inputs_are_constants(tmp_path):
    """A spectrogram's mel filter bank (MelWeightMatrix over fixed sizes) is a constant: evaluated
    at import, the model imports; with an input that is not constant it is named unsupported."""
    ints = {name: numpy_helper.from_array(np.array(v, np.int64), name)
            for name, v in (("bins", 8), ("dft", 32), ("rate", 16000))}
    floats = {name: numpy_helper.from_array(np.array(v, np.float32), name) for name, v in (("lo", 0.0), ("hi", 8000.0))}
    mel = helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "lo", "hi"], ["mel"])
    graph = helper.make_graph([mel, helper.make_node("MatMul", ["x", "mel"], ["y"])], "mel",
                              [helper.make_tensor_value_info("x", F, [4, 17])],
                              [helper.make_tensor_value_info("y", F, [4, 8])],
                              [*ints.values(), *floats.values()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert unsupported_ops(model) == ["<unnamed> (MelWeightMatrix, ai.onnx opset 17)"]
    w, feeds, got = import_and_run(model, tmp_path)
    assert "1 node(s) TVM has no converter or type for evaluated at import (constant inputs)" in w.loaded.notes
    np.testing.assert_allclose(got[0], run_onnxruntime(model, w.inputs, feeds)[0], rtol=1e-5, atol=1e-6)
    # the bin count as a graph input: nothing to evaluate, the operator is named
    del model.graph.initializer[0]  # "bins"
    model.graph.input.append(helper.make_tensor_value_info("bins", TensorProto.INT64, []))
    path = tmp_path / "dynamic.onnx"
    onnx.save(model, path)
    from autofuse.importer import InputSpec

    with pytest.raises(ModelError, match="MelWeightMatrix"):
        prepare(path, [InputSpec("bins", (), "int64")], simplify=False)


@pytest.mark.parametrize("groups", [32, 1, 64])
def test_groupnorm_as_pytorch_exports_it_is_a_group_norm_channels_last_between_convolutions(groups, tmp_path):
    # torch.nn.GroupNorm exports as Reshape [N, G, -1] -> InstanceNormalization -> Reshape back ->
    # Mul/Add by [C, 1, 1]: normalised over the reshape, the image went back to NCHW for each
    # GroupNorm and on to NHWC after it (a VAE decoder's: 0.77x onnxruntime, 0.97x as a group norm)
    from autofuse.tvm_bridge import extract_graph

    c, side = 64, 8
    rng = np.random.default_rng(0)
    consts = {
        "w1": rng.standard_normal((c, c, 3, 3)).astype("float32") / 24,
        "w2": rng.standard_normal((c, c, 3, 3)).astype("float32") / 24,
        "groups": np.array([1, groups, -1], np.int64), "back": np.array([1, c, side, side], np.int64),
        "s": rng.standard_normal(groups).astype("float32"), "b": rng.standard_normal(groups).astype("float32"),
        "gamma": rng.standard_normal((c, 1, 1)).astype("float32"),
        "beta": rng.standard_normal((c, 1, 1)).astype("float32"),
        # groups whose mean is far from zero against their spread: TVM's group norm takes the
        # variance as E[x^2] - E[x]^2 in one pass and lost it (see tvm_bridge._group_norm_two_pass)
        "offset": np.full(c, 300.0, np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "w1", "offset"], ["c1"], pads=[1] * 4),
             helper.make_node("Reshape", ["c1", "groups"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "s", "b"], ["i"], epsilon=1e-5),
             helper.make_node("Reshape", ["i", "back"], ["r2"]),
             helper.make_node("Mul", ["r2", "gamma"], ["m"]), helper.make_node("Add", ["m", "beta"], ["n"]),
             helper.make_node("Relu", ["n"], ["a"]), helper.make_node("Conv", ["a", "w2"], ["y"], pads=[1] * 4)]
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", F, [1, c, side, side])],
                              [helper.make_tensor_value_info("y", F, [1, c, side, side])],
                              [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    w, _ = check_against_onnxruntime(model, tmp_path, tol=1e-4)
    ops = [node.op for node in extract_graph(w.mod).nodes]
    assert sum("transpose" in op for op in ops) == 2 and any("group_norm" in op for op in ops), ops
