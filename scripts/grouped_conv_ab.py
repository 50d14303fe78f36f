"""Grouped 3x3 convolutions (+ ReLU), each an ONNX model of its own, imported, fused with TVM's
plan and built with the rule-based schedules: median of time_evaluator's 7 x 10 runs and GFLOP/s.
Cases from ResNeSt (2 groups), RegNet (groups of 16), ResNeXt (groups of 8) and a depthwise one.

    TVM_NUM_THREADS=2 python scripts/grouped_conv_ab.py
"""

import tempfile
from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from tvm import relax

from autofuse import build
from autofuse.apply import apply_plan
from autofuse.importer import random_inputs
from autofuse.workload import prepare

# (input NCHW, output channels, groups)
CASES = [((1, 512, 14, 14), 1024, 2), ((1, 256, 28, 28), 512, 2), ((1, 128, 56, 56), 256, 2),
         ((1, 64, 56, 56), 128, 2), ((1, 128, 56, 56), 128, 4), ((1, 256, 28, 28), 256, 4),
         ((1, 256, 28, 28), 256, 8), ((1, 224, 28, 28), 224, 14), ((1, 256, 56, 56), 256, 32),
         ((1, 128, 56, 56), 128, 128)]


def model(shape: tuple, out: int, groups: int, path: Path) -> Path:
    w = np.random.default_rng(0).standard_normal((out, shape[1] // groups, 3, 3)).astype("float32") * 0.05
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=groups),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(out, "float32"), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def main() -> None:
    target = build.make_target("llvm")
    with tempfile.TemporaryDirectory() as tmp:
        for shape, out, groups in CASES:
            w = prepare(str(model(shape, out, groups, Path(tmp) / "conv.onnx")), [])
            vm = relax.VirtualMachine(build.build(apply_plan(w.mod, w.graph, w.tvm_default()), target), tvm.cpu())
            args = [tvm.runtime.tensor(v) for v in random_inputs(w.inputs)]
            seconds = float(np.median(vm.time_evaluator("main", tvm.cpu(), number=10, repeat=7)(*args).results))
            flops = 2 * out * (shape[1] // groups) * 9 * shape[2] * shape[3]
            print(f"{shape[1]} -> {out} channels at {shape[2]}x{shape[3]}, {groups} groups: "
                  f"{seconds * 1e3:.3f} ms ({flops / seconds / 1e9:.0f} GFLOP/s)", flush=True)


if __name__ == "__main__":
    main()
