"""PyTorch baselines on the GPU host: eager and torch.compile latency of the benchmark's
`transformers` models, timed with CUDA events (median of samples, each the mean of `number`
calls), written as JSON next to the runner's results.

    python gpu_torch_baselines.py OUT.json --models bert,gpt2

Self-contained apart from hf_models.py (copied beside it): the GPU host has torch and
transformers but not autofuse.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from hf_models import torch_model  # noqa: E402


def time_cuda(fn, number: int, repeat: int) -> list[float]:  # noqa: ANN001
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / number)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--models", default="bert,gpt2")
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    import torch

    rows = []
    for name in args.models.split(","):
        model, inputs, _ = torch_model(name)
        model = model.cuda()
        inputs = tuple(x.cuda() for x in inputs)
        for label, fn in (("torch_eager", model), ("torch_compile", None)):
            t0 = time.time()
            try:
                fn = fn or torch.compile(model)
                with torch.inference_mode():
                    samples = time_cuda(lambda: fn(*inputs), args.number, args.repeat)  # noqa: B023
                rows.append({"model": name, "name": label, "status": "ok", "median_s": statistics.median(samples),
                             "latencies_s": samples, "wall_s": time.time() - t0})
            except Exception as err:  # a baseline that fails is reported, the others still run
                rows.append({"model": name, "name": label, "status": "error", "error": str(err)[:300]})
            print(rows[-1]["model"], rows[-1]["name"], rows[-1].get("median_s"), flush=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda"
    Path(args.out).write_text(json.dumps({"device": device, "torch": torch.__version__, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
