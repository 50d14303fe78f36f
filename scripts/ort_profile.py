"""Where onnxruntime's time goes: each node kind's time per call, grouped by weight and output shape.

The counterpart of `scripts/vm_profile.py` for the baseline: run both on one model to see, layer
by layer, which kernels trail onnxruntime's (ORT's own profiler, median over runs; ORT lays
convolutions out as NCHWc, so match layers by weight and output shape).

    python scripts/ort_profile.py MODEL.onnx [--runs 30] [--threads 2]
"""

import argparse
import collections
import json
import os

import numpy as np
import onnxruntime as ort

from autofuse.importer import InputSpec
from autofuse.importer import random_inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    specs = [InputSpec(i.name, tuple(d if isinstance(d, int) else 1 for d in i.shape),  # a named dimension as 1
                       {"float": "float32", "double": "float64"}.get(i.type[7:-1], i.type[7:-1]))  # "tensor(int64)"
             for i in sess.get_inputs()]
    feeds = dict(zip([s.name for s in specs], random_inputs(specs)))
    for _ in range(args.runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    times: dict[str, list[float]] = collections.defaultdict(list)
    kind: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node, a = e["name"][: -len("_kernel_time")], e["args"]
            times[node].append(e["dur"])
            shapes = [next(iter(d.values())) for d in a.get("input_type_shape", [])]
            out = [next(iter(d.values())) for d in a.get("output_type_shape", [])]
            kind[node] = f"{a.get('op_name')} w={shapes[1] if len(shapes) > 1 else '-'} out={out[0] if out else '-'}"
    rows: dict[str, list[float]] = collections.defaultdict(list)
    for node, t in times.items():
        rows[kind[node]].append(float(np.median(t)))
    total = sum(sum(v) for v in rows.values())
    print(f"onnxruntime, {args.threads} threads: {total / 1e3:.2f} ms in nodes (median per node over {args.runs} runs)")
    for k, v in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(v) / 1e3:8.3f} ms {len(v):4d} calls {sum(v) / len(v):8.0f} us/call  {k}")


if __name__ == "__main__":
    main()
