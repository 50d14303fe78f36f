"""TVM's plan of each model built with the VM's two execution modes, timed in turns.

"bytecode" is tvm.compile's default: the VM interprets `main` an instruction at a time, kernel
calls and the calls between them (allocations, releases, tuples). "compiled" (VMTIRCodeGen,
what build.compile_scheduled uses) compiles `main` into a host function beside the kernels.
The kernels are the same; the outputs must agree exactly. Prints per model: kernels, VM
builtin calls per run (counted through the bytecode VM's instrument hook), build seconds,
median latencies over paired samples (build.time_interleaved, one process) and their paired
ratio (above 1: compiled is faster).

    TVM_NUM_THREADS=2 python scripts/exec_mode_ab.py MODEL.onnx [MODEL.onnx ...] [--repeat 40]
"""

import argparse
import collections
import statistics
import time

import numpy as np
import tvm
from tvm import relax

from autofuse.apply import apply_plan
from autofuse.build import MeasureConfig
from autofuse.build import build
from autofuse.build import make_target
from autofuse.build import run
from autofuse.build import time_interleaved
from autofuse.importer import random_inputs
from autofuse.measure import paired_ratio
from autofuse.workload import prepare

MODES = ("bytecode", "compiled")


def builtin_calls(ex: tvm.runtime.Executable, inputs: list) -> collections.Counter:
    """Calls per run of `main`, kernels and VM builtins, from the bytecode VM's instrument hook."""
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    calls: collections.Counter = collections.Counter()

    def hook(_func, symbol, before, _ret, *_args) -> int:  # noqa: ANN001 - the VM's callback
        if before:
            calls[symbol] += 1
        return 0

    vm.set_instrument(hook)
    vm["main"](*args)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--repeat", type=int, default=40, help="paired samples per mode")
    args = ap.parse_args()
    target, dev = make_target("llvm"), tvm.cpu(0)
    print(f"{'model':24s}{'kernels':>8s}{'builtins':>9s}{'build s':>14s}{'bytecode us':>13s}{'compiled us':>13s}"
          f"{'ratio':>7s}{'max diff':>10s}")
    for path in args.models:
        w = prepare(path)
        mod = apply_plan(w.mod, w.graph, w.tvm_default())
        exes, seconds = {}, {}
        for mode in MODES:
            t0 = time.perf_counter()
            exes[mode] = build(mod, target, exec_mode=mode)
            seconds[mode] = time.perf_counter() - t0
        inputs = random_inputs(w.inputs)
        outs = {mode: run(ex, dev, inputs) for mode, ex in exes.items()}
        diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
                   for a, b in zip(*outs.values()))
        calls = builtin_calls(exes["bytecode"], inputs)
        builtins = sum(n for s, n in calls.items() if s.startswith("vm.builtin."))
        samples = time_interleaved([exes[m] for m in MODES], dev, inputs, MeasureConfig(repeat=args.repeat))
        us = [statistics.median(s) * 1e6 for s in samples]
        name = path.rsplit("/", 1)[-1].removesuffix(".onnx")
        print(f"{name[:24]:24s}{sum(calls.values()) - builtins:8d}{builtins:9d}"
              f"{seconds['bytecode']:7.1f}/{seconds['compiled']:<6.1f}{us[0]:13.1f}{us[1]:13.1f}"
              f"{paired_ratio(samples[0], samples[1]) or float('nan'):7.3f}{diff:10.2g}", flush=True)


if __name__ == "__main__":
    main()
