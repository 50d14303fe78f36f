"""Time compiled model libraries (`autofuse apply -o LIB.so`, e.g. built at two commits) in turns.

One process, the runtime only; build.time_interleaved takes sample i of every library back to
back, so a slow spell of a noisy host hits both. Prints each library's median and the paired
ratio of the first to each other (above 1: the other is faster).

    TVM_NUM_THREADS=2 python scripts/library_ab.py 1x3x224x224 OLD.so NEW.so [--repeat 24]
    TVM_NUM_THREADS=2 python scripts/library_ab.py 1x128:int64 OLD.so NEW.so   # token ids
    python scripts/library_ab.py 1x4000 NEW.so --against model.onnx --repeat 3  # outputs vs onnxruntime

Build the old library outside the repository (`git worktree add /tmp/old COMMIT`, then
`cd /tmp && PYTHONPATH=/tmp/old python -m autofuse.cli apply ...`): `python -m` puts the working
directory first on sys.path, so run from the checkout it builds with the checkout's code.
"""

import argparse

import numpy as np
import tvm

from autofuse.build import MeasureConfig
from autofuse.build import run
from autofuse.build import time_interleaved
from autofuse.importer import InputSpec
from autofuse.importer import random_inputs
from autofuse.importer import run_onnxruntime
from autofuse.worker import compare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", help="the model's inputs in order, SHAPE[:DTYPE] joined by commas, "
                    "e.g. 1x3x224x224 or 1x128:int64 (as importer.random_inputs makes them)")
    ap.add_argument("libs", nargs="+")
    ap.add_argument("--repeat", type=int, default=24)
    ap.add_argument("--against", metavar="MODEL.onnx", help="first check each library's outputs against "
                    "onnxruntime's on this model (same random inputs): prints the largest difference")
    args = ap.parse_args()
    feeds = random_inputs([InputSpec.parse(f"input{i}:{spec}") for i, spec in enumerate(args.inputs.split(","))])
    mods = [tvm.runtime.load_module(p) for p in args.libs]
    if args.against:
        check(args.against, args.libs, mods, feeds)
    samples = time_interleaved(mods, tvm.cpu(0), feeds, MeasureConfig(repeat=args.repeat))
    for path, s in zip(args.libs, samples):
        print(f"{path:40s} median {np.median(s) * 1e3:8.2f} ms  (min {min(s) * 1e3:.2f}, max {max(s) * 1e3:.2f})")
    for path, s in zip(args.libs[1:], samples[1:]):
        print(f"paired {args.libs[0]} / {path}: {np.median(np.array(samples[0]) / np.array(s)):.3f}")


def check(model_path: str, paths: list[str], mods: list, feeds: list[np.ndarray]) -> None:
    """The largest absolute difference of each library's outputs from onnxruntime's."""
    import onnx

    model = onnx.load(model_path)
    weights = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in weights]
    specs = [InputSpec(name, tuple(x.shape), str(x.dtype)) for name, x in zip(names, feeds)]
    want = run_onnxruntime(model, specs, feeds)
    for path, mod in zip(paths, mods):
        got = run(mod, tvm.cpu(0), feeds)  # a loaded library serves as well as an Executable
        same, diff = compare(got, want)
        print(f"{path:40s} max abs difference from onnxruntime {diff:.2e} (largest output value "
              f"{max(float(np.max(np.abs(w))) for w in want):.3g}; {'within' if same else 'OUTSIDE'} the "
              "tuner's tolerance)")


if __name__ == "__main__":
    main()
