"""Quantized ONNX models in QOperator form import as QDQ and match onnxruntime (autofuse.onnx_qlinear)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from autofuse import apply
from autofuse import build
from autofuse.importer import InputSpec
from autofuse.importer import ModelError
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.onnx_qlinear import is_qoperator
from autofuse.onnx_qlinear import to_qdq
from autofuse.workload import prepare

SHAPE = (1, 3, 8, 8)


def float_model() -> onnx.ModelProto:
    """Convolutions, a residual add, concat, pools, sigmoid * leaky relu, matmul and gemm: one of
    each operator onnxruntime's quantizer writes in QOperator form."""
    rng = np.random.default_rng(0)

    def const(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype("float32"), name)

    inits = [const("w1", 8, 3, 3, 3), const("b1", 8), const("w2", 8, 8, 3, 3), const("b2", 8),
             const("w3", 16, 6), const("w4", 6, 5), const("c4", 5)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["r1", "c2"], ["a"]),
        helper.make_node("Concat", ["r1", "a"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Sigmoid", ["ap"], ["sg"]),
        helper.make_node("LeakyRelu", ["ap"], ["lr"], alpha=0.1),
        helper.make_node("Mul", ["sg", "lr"], ["m"]),
        helper.make_node("GlobalAveragePool", ["m"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["mm"]),
        helper.make_node("Gemm", ["mm", "w4", "c4"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 5))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def qoperator(tmp_path_factory) -> Path:
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization import quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": random_inputs_like(seed)} for seed in range(4)])

        def get_next(self):  # noqa: ANN201 - onnxruntime's interface
            return next(self.feeds, None)

    d = tmp_path_factory.mktemp("qlinear")
    onnx.save(float_model(), d / "float.onnx")
    quantize_static(str(d / "float.onnx"), str(d / "q.onnx"), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=True)
    return d / "q.onnx"


def random_inputs_like(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype("float32")


def _output_step(model: onnx.ModelProto) -> float:
    """The quantization step of the model's output (the scale of its last DequantizeLinear)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    return float(np.max(inits[last.input[1]]))


def test_every_qoperator_node_is_rewritten_and_onnxruntime_agrees(qoperator):
    model = onnx.load(qoperator)
    kinds = {n.op_type for n in model.graph.node if is_qoperator(n)}
    assert kinds >= {"QLinearConv", "QLinearAdd", "QLinearConcat", "QLinearAveragePool", "QLinearSigmoid",
                     "QLinearLeakyRelu", "QLinearMul", "QLinearGlobalAveragePool", "QLinearMatMul", "QGemm"}
    qdq, count = to_qdq(model)
    assert count == sum(is_qoperator(n) for n in model.graph.node) and not any(is_qoperator(n) for n in qdq.graph.node)
    onnx.checker.check_model(qdq)
    assert to_qdq(qdq) == (qdq, 0)
    feeds = [random_inputs_like(7)]
    spec = [InputSpec("x", SHAPE, "float32")]
    want, got = run_onnxruntime(model, spec, feeds)[0], run_onnxruntime(qdq, spec, feeds)[0]
    # int32 accumulation and requantisation vs float between Q/DQ: a rounding may land one step over
    assert np.max(np.abs(want - got)) <= 2 * _output_step(model) + 1e-6
    assert np.max(np.abs(want)) > 10 * _output_step(model)  # the output is not all zeros


def test_qoperator_model_imports_and_matches_onnxruntime(qoperator):
    w = prepare(qoperator)
    assert any("QOperator" in n for n in w.loaded.notes)
    feeds = random_inputs(w.inputs)
    want = run_onnxruntime(onnx.load(qoperator), w.inputs, feeds)[0]
    target = build.make_target("llvm")
    for plan in (w.unfused(), w.tvm_default()):
        got = build.run(build.build(apply.apply_plan(w.mod, w.graph, plan), target), build.device_for(target), feeds)[0]
        assert np.max(np.abs(got - want)) <= 2 * _output_step(onnx.load(qoperator)) + 1e-6, plan.name


def test_channels_last_pooling_is_named(tmp_path):
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft",
                            channels_last=1, name="pool")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, (1, 4, 4, 3))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, (1, 1, 1, 3))],
        [numpy_helper.from_array(np.array(0.1, "float32"), "s"), numpy_helper.from_array(np.array(0, "uint8"), "z")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="pool .*channels_last=1 is not supported"):
        prepare(tmp_path / "m.onnx")
