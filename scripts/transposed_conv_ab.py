"""Strided transposed convolutions as TVM lowers them (a convolution over the input dilated with
zeros) against autofuse's rewrite as one convolution of their output phases, each normalised,
fused with TVM's plan and built with the rule-based schedules (median of time_evaluator samples),
and onnxruntime running the same ConvTranspose + Relu (median of its samples); outputs compared.

    TVM_NUM_THREADS=2 python scripts/transposed_conv_ab.py
"""

import numpy as np
import onnx
import tvm
from onnx import helper
from onnx import numpy_helper
from tvm import relax

from autofuse import build
from autofuse.baselines import onnxruntime_runner
from autofuse.baselines import time_callable
from autofuse.importer import InputSpec
from autofuse import tvm_bridge
from autofuse.apply import apply_plan

# (input NCHW, output channels, kernel, stride, padding, output padding): a U-Net decoder's 3x3
# stride-2 upsampling, DCGAN's and Keypoint R-CNN's 4x4 stride-2
CASES = [((1, 64, 56, 56), 32, 3, 2, 1, 1), ((1, 128, 32, 32), 64, 4, 2, 1, 0), ((1, 256, 16, 16), 128, 3, 2, 1, 1)]


def weights(shape: tuple, out_channels: int, kernel: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((shape[1], out_channels, kernel, kernel)).astype("float32") * 0.1


def onnx_model(shape: tuple, out_channels: int, kernel: int, stride: int, padding: int, output_padding: int):
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], strides=[stride] * 2, pads=[padding] * 4,
                              output_padding=[output_padding] * 2),
             helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights(shape, out_channels, kernel), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def module(shape: tuple, out_channels: int, kernel: int, stride: int, padding: int, output_padding: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(weights(shape, out_channels, kernel))
            up = relax.op.nn.conv2d_transpose(x, w, strides=stride, padding=padding, output_padding=output_padding)
            out = bb.emit_output(relax.op.nn.relu(up))
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    rewriter = tvm_bridge._LayoutRewriter._cls  # the class behind TVM's mutator wrapper
    phases = rewriter._phase_convolution
    target, dev = build.make_target("llvm"), tvm.cpu()
    try:
        for case in CASES:
            mod = module(*case)
            x = np.random.default_rng(1).standard_normal(case[0]).astype("float32")
            res = {}
            for name in ("dilated", "phases"):
                rewriter._phase_convolution = phases if name == "phases" else (lambda self, call: call)
                normal = tvm_bridge.normalize(mod)
                graph = tvm_bridge.extract_graph(normal)
                ex = build.build(apply_plan(normal, graph, tvm_bridge.fuseops_plan(normal, graph)), target)
                vm = relax.VirtualMachine(ex, dev)
                timer = vm.time_evaluator("main", dev, number=5, repeat=7, min_repeat_ms=50)
                res[name] = (timer(tvm.runtime.tensor(x, dev)).median * 1e6, build.run(ex, dev, [x])[0])
            run = onnxruntime_runner(onnx_model(*case), [InputSpec("x", case[0])], [x])
            ort = float(np.median(time_callable(run, repeat=7, min_repeat_s=0.05))) * 1e6
            diff = max(float(np.abs(res[name][1] - run()[0]).max()) for name in res)
            shape, out_channels, kernel, stride, padding, output_padding = case
            print(f"{shape} -> {out_channels} channels, {kernel}x{kernel} stride {stride} padding {padding} "
                  f"output padding {output_padding}: dilated {res['dilated'][0]:.0f} us, phases "
                  f"{res['phases'][0]:.0f} us, onnxruntime {ort:.0f} us; max diff from onnxruntime {diff:.1e}")
    finally:
        rewriter._phase_convolution = phases


if __name__ == "__main__":
    main()
