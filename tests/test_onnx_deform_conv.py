"""ONNX DeformConv (autofuse.onnx_deform_conv) computes what ONNX's reference implementation does,
offsets that sample outside the image, masks, groups and offset groups included."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_import import import_and_run

F = TensorProto.FLOAT


def deform_conv(c: int, out_c: int, size: int, kernel: int, group: int, offset_group: int, mask: bool,
                strides: int, pads: int, dilations: int) -> onnx.ModelProto:
    """One DeformConv on x [1, c, size, size] with the offsets (and mask) as graph inputs, the
    weights and bias as initializers."""
    out = (size + 2 * pads - dilations * (kernel - 1) - 1) // strides + 1
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("x", F, [1, c, size, size]),
              helper.make_tensor_value_info("offset", F, [1, offset_group * 2 * kernel * kernel, out, out])]
    names = ["x", "w", "offset", "b"]
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", F, [1, offset_group * kernel * kernel, out, out]))
        names.append("mask")
    inits = [numpy_helper.from_array(rng.standard_normal((out_c, c // group, kernel, kernel)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(out_c).astype(np.float32), "b")]
    node = helper.make_node("DeformConv", names, ["y"], kernel_shape=[kernel, kernel], group=group,
                            offset_group=offset_group, strides=[strides] * 2, pads=[pads] * 4,
                            dilations=[dilations] * 2)
    graph = helper.make_graph([node], "deform", inputs, [helper.make_tensor_value_info("y", F, [1, out_c, out, out])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("group,offset_group,mask,strides,pads,dilations", [
    (1, 1, False, 1, 1, 1),
    (2, 2, True, 2, 0, 1),
    (1, 2, True, 1, 2, 2),
])
def test_deform_conv_matches_the_onnx_reference(tmp_path, group, offset_group, mask, strides, pads, dilations):
    model = deform_conv(4, 4, 6, 3, group, offset_group, mask, strides, pads, dilations)
    rng = np.random.default_rng(1)
    shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input]
    feeds = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    feeds[1] *= 2.5  # offsets of a few pixels: some taps land between pixels, some outside the image
    w, feeds, got = import_and_run(model, tmp_path, feeds=feeds)
    want = ReferenceEvaluator(model).run(None, {s.name: v for s, v in zip(w.inputs, feeds)})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
