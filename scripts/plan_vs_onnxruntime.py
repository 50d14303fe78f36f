"""TVM's plan of a model built once, run twice on one random input (wall time of each run), and
each output compared with onnxruntime's on the same input (shape, max abs difference).

For models too slow for `zoo_check.py --one`'s timed rounds (Keypoint R-CNN with detections):

    TVM_NUM_THREADS=2 python scripts/plan_vs_onnxruntime.py MODEL.onnx
"""

import sys
import time

import numpy as np

from autofuse import apply
from autofuse import build
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.workload import prepare


def main(path: str) -> None:
    w = prepare(path, [])
    target = build.make_target("llvm")
    t0 = time.time()
    ex = build.build(apply.apply_plan(w.mod, w.graph, w.tvm_default()), target)
    print(f"build {time.time() - t0:.1f} s", flush=True)
    feeds = random_inputs(w.inputs)
    for run in ("first", "second"):
        t0 = time.time()
        got = build.run(ex, build.device_for(target), feeds)
        print(f"{run} run {time.time() - t0:.2f} s", flush=True)
    want = run_onnxruntime(w.loaded.onnx_model, w.inputs, feeds)
    for g, r in zip(got, want):
        diff = float(np.abs(g.astype("float64") - r).max()) if g.shape == r.shape and g.size else "-"
        print(g.shape, r.shape, diff)


if __name__ == "__main__":
    main(sys.argv[1])
