"""Time a detector head's kernels over a number of rows known only at run time, as autofuse
builds them (run_time_rows: a chunk of rows at a time), beside the same kernels built for that
number of rows as a static shape, and check both against each other.

    TVM_NUM_THREADS=2 python scripts/run_time_rows_bench.py [--rows 8,13,64,150] [--repeat 7]

The kernels are Faster R-CNN-MobileNetV3's at 320: its box head's [n, 12544] x [12544, 1024]
matmul + ReLU (constant weights, re-laid as the rules read them) and RoiAlign of n boxes over a
[1, 256, 10, 10] feature map to 7x7 bins, 2x2 samples each.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import tvm
from tvm import relax
from tvm import tirx

from autofuse.build import MeasureConfig
from autofuse.build import build
from autofuse.build import device_for
from autofuse.build import make_target
from autofuse.build import run
from autofuse.build import time_latency


def _module(rows: object, head: str, weights: np.ndarray) -> tvm.IRModule:
    """main(x) for `head` ("matmul": x [rows, 12544]; "roi_align": boxes [rows, 5] over a constant
    feature map), legalized and fused as TVM does."""
    bb = relax.BlockBuilder()
    if head == "matmul":
        x = relax.Var("x", relax.TensorType([rows, weights.shape[0]], "float32"))
        make = lambda: relax.op.nn.relu(relax.op.matmul(x, relax.const(weights)))  # noqa: E731
    else:
        x = relax.Var("x", relax.TensorType([rows, 5], "float32"))
        make = lambda: relax.op.vision.roi_align(relax.const(weights), x, (7, 7), 1 / 32, sample_ratio=2)  # noqa: E731
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make())
        bb.emit_func_output(out)
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
              relax.transform.FuseTIR()]
    return tvm.transform.Sequential(passes)(bb.get())


def _inputs(head: str, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    if head == "matmul":
        return [rng.standard_normal((n, 12544)).astype("float32")]
    corners = rng.uniform(0, 250, (n, 2))
    boxes = np.concatenate([np.zeros((n, 1)), corners, corners + rng.uniform(10, 150, (n, 2))], 1)
    return [boxes.astype("float32")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,13,64,150")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    target = make_target("llvm")
    dev = device_for(target)
    config = MeasureConfig(repeat=args.repeat)
    rng = np.random.default_rng(0)
    weights = {"matmul": rng.standard_normal((12544, 1024)).astype("float32") * 0.01,
               "roi_align": rng.standard_normal((1, 256, 10, 10)).astype("float32")}
    print(f"{'kernel':10} {'rows':>5} {'run-time rows ms':>17} {'static rows ms':>15}  max diff")
    for head, w in weights.items():
        chunked = build(_module(tirx.Var("n", "int64"), head, w), target)
        for n in (int(r) for r in args.rows.split(",")):
            inputs = _inputs(head, n, rng)
            static = build(_module(n, head, w), target)
            diff = float(np.abs(run(chunked, dev, inputs)[0] - run(static, dev, inputs)[0]).max())
            ms = [statistics.median(time_latency(ex, dev, inputs, config)) * 1e3 for ex in (chunked, static)]
            print(f"{head:10} {n:5d} {ms[0]:17.2f} {ms[1]:15.2f}  {diff:.2e}")


if __name__ == "__main__":
    main()
