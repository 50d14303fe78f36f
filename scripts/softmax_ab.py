"""Softmax (or, with --layer-norm, LayerNormalization) over the last axis, each shape an ONNX
model of its own, imported, fused with TVM's plan and built with the rule-based schedules,
beside onnxruntime on the same input (timed after all of TVM's: its threads spin on after its
runs): medians of time_evaluator's 7 x 50 runs and of 7 onnxruntime samples of at least 20 ms.
Rows of 197 (ViT's tokens), 730 (PiT's) and 49 (Swin's windows) are what no vector width
divides, 196 (ConViT's) what only a quarter vector divides; 208 is the control.

    TVM_NUM_THREADS=2 python scripts/softmax_ab.py [--shapes 1x4x200x200,64x56x56]
    TVM_NUM_THREADS=2 python scripts/softmax_ab.py --layer-norm --shapes 1x3136x56,1x784x200,1x196x120,1x197x196
"""

import argparse
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
from autofuse.baselines import time_onnxruntime
from autofuse.importer import random_inputs
from autofuse.workload import prepare

SHAPES = "1x4x197x197,1x12x197x197,1x4x197x208,1x2x730x730,192x49x49,1x4x196x196"


def model(shape: tuple, path: Path, layer_norm: bool) -> Path:
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "y")]
    if layer_norm:  # scale 1.1, bias 0.1
        weights = [numpy_helper.from_array(np.full(shape[-1], v, "float32"), n) for n, v in (("g", 1.1), ("b", 0.1))]
        node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)
    else:
        weights, node = [], helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    graph = helper.make_graph([node], "g", io[:1], io[1:], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma list of shapes, dimensions joined by x")
    ap.add_argument("--layer-norm", action="store_true", help="LayerNormalization instead of Softmax")
    args = ap.parse_args()
    target = build.make_target("llvm")
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for spec in args.shapes.split(","):  # TVM's plan first, then onnxruntime
            shape = tuple(int(d) for d in spec.split("x"))
            w = prepare(str(model(shape, Path(tmp) / f"op{len(cases)}.onnx", args.layer_norm)), [])
            vm = relax.VirtualMachine(build.build(apply_plan(w.mod, w.graph, w.tvm_default()), target), tvm.cpu())
            values = random_inputs(w.inputs)
            tensors = [tvm.runtime.tensor(v) for v in values]
            ours = float(np.median(vm.time_evaluator("main", tvm.cpu(), number=50, repeat=7)(*tensors).results))
            cases.append((spec, w, values, ours))
        for spec, w, values, ours in cases:
            theirs = float(np.median(time_onnxruntime(w.loaded.onnx_model, w.inputs, values, repeat=7)))
            print(f"{spec}: TVM's plan {ours * 1e6:.1f} us, onnxruntime {theirs * 1e6:.1f} us "
                  f"({theirs / ours:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
