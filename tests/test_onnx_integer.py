"""onnxruntime's quantize_dynamic models: ConvInteger and MatMulInteger computed as float ops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofuse import apply
from autofuse import build
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.models import conv_block
from autofuse.models import transformer_block
from autofuse.workload import prepare


@pytest.mark.parametrize("model, per_channel", [(conv_block, False), (conv_block, True), (transformer_block, False)])
def test_integer_operators_compute_as_onnxruntimes(tmp_path, model, per_channel):
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic

    onnx.save(model(), tmp_path / "float.onnx")
    # reduce_range: 7-bit weights, as onnxruntime advises on CPUs without VNNI, where its u8s8
    # kernels saturate 16-bit intermediate sums (0.03 off the exact integers on the transformer
    # block at full range, which TVM computes exactly either way)
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "int8.onnx", weight_type=QuantType.QInt8,
                     per_channel=per_channel, reduce_range=True)
    original = onnx.load(tmp_path / "int8.onnx")
    assert {"ConvInteger", "MatMulInteger"} & {n.op_type for n in original.graph.node}
    w = prepare(tmp_path / "int8.onnx")
    assert any("integer operator(s)" in n for n in w.loaded.notes)
    ops = " ".join(n.op for n in w.graph.nodes)
    assert "int32" not in " ".join(n.dtype for n in w.graph.nodes if "conv" in n.op or "matmul" in n.op)
    # each result went on to float as it was: no cast through int32 (whose non-finite guard,
    # a where, kept the epilogues channels-first: a transpose into and out of each of them)
    assert "int32" not in " ".join(n.dtype for n in w.graph.nodes) and "where" not in ops
    if model is conv_block:  # float convolutions, channels-last; NCHW in and out only (9 through int32)
        assert "conv2d_nhwc" in w.mod.script(), ops
        assert sum(n.op.startswith("transpose") for n in w.graph.nodes) == 2, ops
    feeds = random_inputs(w.inputs)
    got = build.run(build.build(apply.apply_plan(w.mod, w.graph, w.tvm_default()), build.make_target("llvm")),
                    build.device_for(build.make_target("llvm")), feeds)
    want = run_onnxruntime(original, w.inputs, feeds)  # the model as onnxruntime's quantizer wrote it
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())


def test_a_bias_added_in_int32_is_added_in_float(tmp_path):
    """Older quantize_dynamic models (ddddocr's int8 CRNN) add a bias quantized at run time to
    the int32 result, then cast to float: the chain is computed in float, the convolutions stay
    channels-last (through int32, a transpose into and out of each epilogue)."""
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-60, 60, (8, 4, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.array(0, np.int8), "wzp"),
             numpy_helper.from_array(np.array(0.02, np.float32), "ws"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 1)).astype(np.float32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"])]
    for k in range(2):  # two convolutions, the second on the first's output
        src = "x" if k == 0 else "y0"
        if k:
            nodes.append(helper.make_node("DynamicQuantizeLinear", [src], ["xq1", "xs1", "xzp1"]))
        q, s, z = ("xq", "xs", "xzp") if k == 0 else ("xq1", "xs1", "xzp1")
        w = "wq" if k == 0 else "wq1"
        nodes += [
            helper.make_node("Mul", [s, "ws"], [f"scale{k}"]),
            helper.make_node("Div", ["bias", f"scale{k}"], [f"bdiv{k}"]),
            helper.make_node("Floor", [f"bdiv{k}"], [f"bfloor{k}"]),
            helper.make_node("Cast", [f"bfloor{k}"], [f"bq{k}"], to=TensorProto.INT32),
            helper.make_node("ConvInteger", [q, w, z, "wzp"], [f"c{k}"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", [f"c{k}", f"bq{k}"], [f"cb{k}"]),
            helper.make_node("Cast", [f"cb{k}"], [f"cf{k}"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"cf{k}", f"scale{k}"], [f"y{k}"]),
        ]
    inits.append(numpy_helper.from_array(rng.integers(-60, 60, (8, 8, 3, 3)).astype(np.int8), "wq1"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
                              [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 8, 12, 12])], inits)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(original, tmp_path / "int8_bias.onnx")
    w = prepare(tmp_path / "int8_bias.onnx")
    ops = " ".join(n.op for n in w.graph.nodes)
    # the input and the output transposed, not each epilogue (the bias's 8 values are)
    assert sum(n.op.startswith("transpose") and n.bytes_out > 8 * 4 for n in w.graph.nodes) == 2, ops
    assert "where" not in ops
    feeds = random_inputs(w.inputs)
    got = build.run(build.build(apply.apply_plan(w.mod, w.graph, w.tvm_default()), build.make_target("llvm")),
                    build.device_for(build.make_target("llvm")), feeds)
    want = run_onnxruntime(original, w.inputs, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4 * np.abs(want[0]).max())
