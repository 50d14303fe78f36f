"""Time TVM's plan's kernels alone under several register-tile budgets, in turns.

The rule-based CPU schedule sizes its register tiles by `accumulators(vector_bits)`; this puts
the candidates side by side on this machine, kernel by kernel, so that a choice is measured
rather than guessed (kernels v8: 16 accumulators on AVX-512, 12 on AVX2).

    python scripts/kernel_ab.py MODEL.onnx [--acc 16,12,8] [--rounds 6] [--top 12] [--cold] [--no-pack]

Each kernel is compiled once per budget; every round times every variant once (median of 5
repeats of at least 20 ms), and the table reports the median over rounds, with the number of
times main calls the kernel and the base variant's GFLOP/s; the sum weights each kernel by its calls. Set TVM_NUM_THREADS
as the measurement worker does (autofuse.build.cpu_threads) to compare like with like.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import tvm
from tvm.s_tir.analysis import estimate_tir_flops

from autofuse.apply import fuse
from autofuse.build import kernel_args
from autofuse.build import make_target
from autofuse.schedule import LAYOUT_FREE_ATTR
from autofuse.schedule import schedule_candidates
from autofuse.schedule import unscheduled_kernels
from autofuse.schedule import vector_bits
from autofuse.schedule import vector_lanes
from autofuse.tvm_bridge import main_block
from autofuse.workload import prepare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--acc", default="16,12,8", help="accumulator budgets to compare, the first is the base")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--top", type=int, default=12, help="kernels to list (slowest first)")
    ap.add_argument("--cold", action="store_true",
                    help="flush the caches before every call (weights come from memory, as in the model)")
    ap.add_argument("--no-pack", action="store_true", help="keep constant weights in their layout (kernels v8)")
    args = ap.parse_args()
    accs = [int(a) for a in args.acc.split(",")]

    w = prepare(args.model)
    target = make_target("llvm")
    bits = vector_bits(target)
    fused, _ = fuse(w.mod, w.graph, w.tvm_default())
    kernels = {gv.name_hint: f for gv, f in unscheduled_kernels(fused).items()}  # as ScheduleCPU sees them
    variants = {}
    for name, func in kernels.items():
        if args.no_pack:
            func = func.without_attr(LAYOUT_FREE_ATTR)
        for acc in accs:
            scheduled = next(schedule_candidates(func, vector_lanes(func, bits), acc), None) or func
            variants[(name, acc)] = scheduled.with_attr("global_symbol", f"{name}__{acc}")
    lib = tvm.compile(tvm.IRModule({f"{n}__{a}": f for (n, a), f in variants.items()}), target=target).jit()

    dev, rng = tvm.cpu(), np.random.default_rng(0)
    buffers = {key: kernel_args(func, dev, rng) for key, func in variants.items()}
    samples: dict[tuple[str, int], list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, acc in variants:
            timer = lib.time_evaluator(f"{name}__{acc}", dev, number=1, repeat=5, min_repeat_ms=0 if args.cold else 20,
                                       f_preproc="cache_flush_cpu_non_first_arg" if args.cold else "")
            samples[(name, acc)].append(float(np.median(timer(*buffers[(name, acc)]).results)) * 1e6)

    names = list(dict.fromkeys(n for n, _ in variants))
    # a kernel runs once per call in main (ViT's QKV projections: one kernel, 8 calls)
    calls = Counter(b.value.args[0].name_hint for b in main_block(fused).node_bindings)
    us = {n: [float(np.median(samples[(n, a)])) for a in accs] for n in names}
    print(f"{target.attrs.get('mcpu', '')}, {bits}-bit vectors; kernel us, median of {args.rounds} rounds")
    # GFLOP/s of the base variant: how far each kernel is from the machine's peak
    flops = {n: float(estimate_tir_flops(tvm.IRModule({"main": kernels[n]}))) for n in names}
    print(f"{'kernel':55s}{'calls':>6s}" + "".join(f"{'acc ' + str(a):>10s}" for a in accs) + f"{'GFLOP/s':>9s}")
    for n in sorted(names, key=lambda n: -max(us[n]) * calls[n])[: args.top]:
        print(f"{n[:55]:55s}{calls[n]:6d}" + "".join(f"{t:10.1f}" for t in us[n]) + f"{flops[n] / us[n][0] / 1e3:9.1f}")
    label = f"sum over {sum(calls[n] for n in names)} calls of {len(names)} kernels"
    print(f"{label:61s}" + "".join(f"{sum(us[n][k] * calls[n] for n in names):10.1f}" for k in range(len(accs))))


if __name__ == "__main__":
    main()
