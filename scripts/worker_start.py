"""What a measurement worker costs to start, as every decision round pays it: `import tvm` in
a fresh interpreter with and without torch (tvm_ffi imports it when installed; the worker marks
it absent), then the worker's own starts for MODEL (the workload loaded from its saved files,
its graph read), the first including the parent's save.

    python scripts/worker_start.py MODEL [--starts 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from autofuse.measure import IsolatedMeasurer
from autofuse.workload import prepare


def _import_s(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--starts", type=int, default=3)
    args = ap.parse_args()
    plain, without_torch = _import_s("import tvm"), _import_s("import sys; sys.modules['torch'] = None; import tvm")
    print(f"import tvm: {plain:.2f} s; torch marked absent: {without_torch:.2f} s")
    w = prepare(args.model)
    with IsolatedMeasurer(w) as m:
        for k in range(args.starts):
            t0 = time.perf_counter()
            if m._ensure_worker() is None:
                raise SystemExit("the worker did not start")
            print(f"worker start {k + 1}: {time.perf_counter() - t0:.2f} s")
            m.restart()


if __name__ == "__main__":
    main()
