"""Softmax over the last axis, each shape an ONNX model of its own, imported, fused with TVM's
plan and built with the rule-based schedules, beside onnxruntime on the same input (timed after
all of TVM's): medians of time_evaluator's 7 x 50 runs and of 7 onnxruntime samples of at least
20 ms. Rows of 197 (ViT's tokens), 730 (PiT's) and 49 (Swin's windows) are what no vector width
divides, 196 (ConViT's) what only a quarter vector divides; 208 is the control.

    TVM_NUM_THREADS=2 python scripts/softmax_ab.py
"""

import tempfile
from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import TensorProto
from onnx import helper
from tvm import relax

from autofuse import build
from autofuse.apply import apply_plan
from autofuse.baselines import onnxruntime_runner
from autofuse.baselines import time_callable
from autofuse.importer import random_inputs
from autofuse.workload import prepare

SHAPES = [(1, 4, 197, 197), (1, 12, 197, 197), (1, 4, 197, 208), (1, 2, 730, 730), (192, 49, 49), (1, 4, 196, 196)]


def model(shape: tuple, path: Path) -> Path:
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g", io[:1], io[1:])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def main() -> None:
    target = build.make_target("llvm")
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for shape in SHAPES:  # TVM's plan first: onnxruntime's threads spin on after its runs
            path = model(shape, Path(tmp) / f"softmax{len(cases)}.onnx")
            w = prepare(str(path), [])
            vm = relax.VirtualMachine(build.build(apply_plan(w.mod, w.graph, w.tvm_default()), target), tvm.cpu())
            values = random_inputs(w.inputs)
            args = [tvm.runtime.tensor(v) for v in values]
            ours = float(np.median(vm.time_evaluator("main", tvm.cpu(), number=50, repeat=7)(*args).results))
            cases.append((shape, path, w.inputs, values, ours))
        for shape, path, inputs, values, ours in cases:
            theirs = float(np.median(time_callable(onnxruntime_runner(str(path), inputs, values), repeat=7)))
            print(f"{'x'.join(map(str, shape))}: TVM's plan {ours * 1e6:.1f} us, onnxruntime {theirs * 1e6:.1f} us "
                  f"({theirs / ours:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
