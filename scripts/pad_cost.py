"""What a convolution's padding copy costs: a kernel dumped by `scripts/schedule_ab.py dump`
timed as it is, and again with its padding loop nest cut out and the padded buffer passed in as
an argument (so the convolution reads it as before, and nothing is left to compute it).

    python scripts/schedule_ab.py dump DIR MODEL.onnx KERNEL
    TVM_NUM_THREADS=2 python scripts/pad_cost.py DIR/KERNEL.py [--rounds 5]

Expects the padding (`pad_temp`) to be the kernel's first loop nest, as the rule-based schedule
leaves it where it does not pad tile by tile (`schedule._pad_in_tiles`).
"""

import argparse
import re

import numpy as np
import tvm

from autofuse.build import make_target


def without_pad(src: str) -> str:
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    for "))
    if 'T.sblock("pad_temp")' not in "\n".join(lines[start:start + 4]):
        raise SystemExit("the kernel's first loop nest is not its padding")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("    for "))
    alloc = next(line for line in lines if line.strip().startswith("pad_temp = T.sblock_alloc_buffer"))
    shape = re.search(r"alloc_buffer\((\(.*\))\)", alloc).group(1)
    kept = [line for line in lines[:start] + lines[end:] if line != alloc]
    at = next(i for i, line in enumerate(kept) if line.startswith("def main("))
    kept[at] = kept[at].replace("def main(", f'def main(pad_temp: T.Buffer({shape}, "float32"), ')
    return "\n".join(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    src = open(args.kernel).read()
    funcs = {"whole kernel": tvm.script.from_source(src),
             "without its padding": tvm.script.from_source(without_pad(src))}
    dev, target = tvm.cpu(), make_target("llvm")
    rng = np.random.default_rng(0)
    libs, feeds = {}, {}
    for name, f in funcs.items():
        libs[name] = tvm.tirx.build(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=target)
        feeds[name] = [tvm.runtime.tensor(rng.standard_normal([int(x) for x in p.shape]).astype("float32"), dev)
                       for p in f.params]
    times = {name: [] for name in funcs}
    for _ in range(args.rounds):  # in turns
        for name in funcs:
            ev = libs[name].time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=20)
            times[name].append(float(np.median(ev(*feeds[name]).results)) * 1e6)
    for name, ts in times.items():
        print(f"{name:22s} {np.median(ts):8.1f} us (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
