"""Where a model's time goes inside the VM: each kernel's time per call, in the model.

Builds TVM's plan with the rule-based schedules and times every call of `main` through the VM's
instrument hook (kernels then read their inputs as the model leaves them, unlike
`scripts/kernel_ab.py`, which times each kernel alone). The hook adds a little per call: the
instrumented total is printed beside time_evaluator's.

    TVM_NUM_THREADS=2 python scripts/vm_profile.py MODEL.onnx [--input name:1x128:int64] [--top 25]
"""

import argparse
import collections
import time

import numpy as np
import tvm
from tvm import relax

from autofuse.apply import apply_plan
from autofuse.build import build
from autofuse.build import make_target
from autofuse.importer import InputSpec
from autofuse.importer import random_inputs
from autofuse.workload import prepare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--input", action="append", default=[])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    w = prepare(args.model, [InputSpec.parse(s) for s in args.input])
    dev = tvm.cpu(0)
    mod = apply_plan(w.mod, w.graph, w.tvm_default())
    ex = build(mod, make_target("llvm"), exec_mode="bytecode")  # the hook sees the VM's instructions only
    # each kernel's buffer shapes (inputs, weights, output last): to match onnxruntime's layers
    shapes = {gv.name_hint: " ".join("x".join(str(d) for d in getattr(b, "shape", ())) or str(b) for b in f.params)
              for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    feeds = [tvm.runtime.tensor(x, dev) for x in random_inputs(w.inputs)]
    whole = np.median(relax.VirtualMachine(ex, dev).time_evaluator("main", dev, number=3, repeat=5)(*feeds).results)
    vm = relax.VirtualMachine(ex, dev)
    for _ in range(3):
        vm["main"](*feeds)
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    start = [0.0]

    def hook(_func, symbol, before, _ret, *_args) -> int:  # noqa: ANN001 - the VM's callback
        if before:
            start[0] = time.perf_counter()
        else:
            spent[symbol] += time.perf_counter() - start[0]
            calls[symbol] += 1
        return 0

    vm.set_instrument(hook)
    t0 = time.perf_counter()
    for _ in range(args.runs):
        vm["main"](*feeds)
    instrumented = (time.perf_counter() - t0) / args.runs
    print(f"time_evaluator {whole * 1e3:.2f} ms; instrumented {instrumented * 1e3:.2f} ms, of which calls "
          f"{sum(spent.values()) / args.runs * 1e3:.2f} ms over {sum(calls.values()) // args.runs} calls")
    for name, s in sorted(spent.items(), key=lambda kv: -kv[1])[: args.top]:
        per_call = s / args.runs / max(1, calls[name] // args.runs) * 1e6
        print(f"{name[:48]:48s} {calls[name] // args.runs:4d} calls {s / args.runs * 1e3:8.3f} ms {per_call:8.1f} us/call"
              f"  {shapes.get(name, '')}")


if __name__ == "__main__":
    main()
