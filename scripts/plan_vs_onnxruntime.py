"""TVM's plan of a model built once, run twice on one random input (wall time of each run), each
output compared with onnxruntime's on the same input (shape, max abs difference, share of elements
off by more than 1e-3), then both timed on that input: onnxruntime first, then TVM's plan, each
`--repeat` samples after warm-up calls (median and interquartile spread / median).

For models too slow for `zoo_check.py --one`, whose reference (the unfused model as plain loop
nests) takes longer than its worker may (Keypoint R-CNN with detections):

    TVM_NUM_THREADS=2 python scripts/plan_vs_onnxruntime.py MODEL.onnx [--repeat 5]
"""

import argparse
import time

import numpy as np
import tvm
from tvm import relax

from autofuse import apply
from autofuse import build
from autofuse.baselines import median_and_spread
from autofuse.baselines import onnxruntime_runner
from autofuse.baselines import time_callable
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.workload import prepare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--repeat", type=int, default=5, help="timed samples of each runtime (0: outputs only)")
    args = ap.parse_args()
    w = prepare(args.model, [])
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
        if g.shape != r.shape or not g.size:
            print(g.shape, r.shape, "-")
            continue
        diff = np.abs(g.astype("float64") - r)
        # (the share of elements off by more than 1e-3: a detector's masks pasted one pixel
        # apart where a box's edge rounds the other way differ by ~1 there, and only there)
        # and the largest |output|, the scale the difference is to be read against
        print(g.shape, r.shape, f"max abs diff {float(diff.max()):.3g}, {float((diff > 1e-3).mean()):.2%} over 1e-3, "
              f"largest |output| {float(np.abs(r).max()):.3g}")
    if args.repeat <= 0:
        return
    device = build.device_for(target)
    vm = relax.VirtualMachine(ex, device)
    tensors = [tvm.runtime.tensor(x, device) for x in feeds]
    ort = time_callable(onnxruntime_runner(w.loaded.onnx_model, w.inputs, feeds), args.repeat)
    time.sleep(1)  # onnxruntime's threads settle before TVM's run
    tvm_s = time_callable(lambda: vm["main"](*tensors), args.repeat)
    (ort_med, ort_spread), (tvm_med, tvm_spread) = median_and_spread(ort), median_and_spread(tvm_s)
    print(f"onnxruntime {ort_med:.6f} s (spread {ort_spread or 0:.1%}), TVM's plan {tvm_med:.6f} s "
          f"(spread {tvm_spread or 0:.1%}): onnxruntime / TVM's plan {ort_med / tvm_med:.2f}x")


if __name__ == "__main__":
    main()
