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
    if model is conv_block:  # NCHW in and out only (9 transposes through int32)
        assert sum(n.op.startswith("transpose") for n in w.graph.nodes) == 2, ops
    if model is conv_block:
        assert "conv2d_nhwc" in w.mod.script(), ops  # float convolutions, channels-last
    feeds = random_inputs(w.inputs)
    got = build.run(build.build(apply.apply_plan(w.mod, w.graph, w.tvm_default()), build.make_target("llvm")),
                    build.device_for(build.make_target("llvm")), feeds)
    want = run_onnxruntime(original, w.inputs, feeds)  # the model as onnxruntime's quantizer wrote it
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
