"""How TVM's and onnxruntime's waiting threads slow each other in one process, on these cores.

Each runtime keeps its threads busy for a while after it ran: TVM's pool threads yield in a loop
(300,000 turns, TVM_THREAD_POOL_SPIN_COUNT) after every parallel kernel, onnxruntime's threads
spin after each run. Timed in turns with no pause, the other runtime's next sample shares the
cores with them. This takes onnxruntime's and one plan's samples in turns, with pauses of 0 to
300 ms after each, and then each alone, and prints the medians (the worker's protocol since the
measurement of onnxruntime moved before the plans: worker._measure_together).

    TVM_NUM_THREADS=2 python scripts/runtime_interference.py MODEL.onnx [--plan all_fused] [--samples 8]
"""

import argparse
import statistics
import time

import tvm
from tvm import relax

from autofuse.apply import apply_plan
from autofuse.baselines import onnxruntime_runner
from autofuse.baselines import sampler
from autofuse.build import build
from autofuse.build import make_target
from autofuse.importer import random_inputs
from autofuse.space import SearchSpace
from autofuse.workload import prepare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--plan", default="tvm", help="'tvm' (TVM's plan) or a seed plan's name (SearchSpace.plus_kinds)")
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()
    w = prepare(args.model)
    plans = {p.name: p for p in SearchSpace(w.graph).plus_kinds(w.tvm_default())} | {"tvm": w.tvm_default()}
    feeds = random_inputs(w.inputs)
    dev = tvm.cpu(0)
    tensors = [tvm.runtime.tensor(x, dev) for x in feeds]
    ort = sampler(onnxruntime_runner(w.loaded.onnx_model, w.inputs, feeds))
    vm = relax.VirtualMachine(build(apply_plan(w.mod, w.graph, plans[args.plan]), make_target("llvm")), dev)
    plan = vm.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=20)
    print(f"{args.plan}: median of {args.samples} samples (us)")
    for pause in (0.0, 0.02, 0.05, 0.3):
        tvm_s, ort_s = [], []
        for _ in range(args.samples):
            ort_s.append(ort())
            time.sleep(pause)
            tvm_s.append(plan(*tensors).results[0])
            time.sleep(pause)
        print(f"in turns, {pause * 1e3:3.0f} ms pauses: plan {statistics.median(tvm_s) * 1e6:9.2f}  "
              f"onnxruntime {statistics.median(ort_s) * 1e6:9.2f}", flush=True)
    alone = [plan(*tensors).results[0] for _ in range(args.samples)]
    time.sleep(0.3)
    ort_alone = [ort() for _ in range(args.samples)]
    print(f"each alone, plan first:      plan {statistics.median(alone) * 1e6:9.2f}  "
          f"onnxruntime {statistics.median(ort_alone) * 1e6:9.2f}")


if __name__ == "__main__":
    main()
