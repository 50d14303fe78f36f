"""How consistent the tuner's kernel times are between two tuning logs of the same models.

Each kernel (by hash) first timed in both logs gives a ratio of its times, and the ratio of
TVM's plan's median in the two trials that timed it. Prints, over kernels of 3 us and more,
the standard deviation of the log ratios as measured and as scaled by TVM's plan's ratio
(what the tuner did until 2026-12-05), for all pairs and for those whose TVM plan read over
1.2x apart. The README's 11% / 16% came from this on four models' logs:

    python scripts/kernel_time_spread.py /tmp/ab/vA-swin:/tmp/ab/vB-swin /tmp/ab/vA-bert:/tmp/ab/vB-bert ...
"""
import json
import statistics
import sys

import numpy as np


def first_times(log_dir: str) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for line in open(f"{log_dir}/records.jsonl"):
        m = json.loads(line)["measurement"]
        if m.get("default_latencies_s"):
            default_s = statistics.median(m["default_latencies_s"])
            for k, t in (m.get("kernel_latencies_s") or {}).items():
                out.setdefault(k, (t, default_s))
    return out


x, y = [], []
for pair in sys.argv[1:]:
    a, b = (first_times(d) for d in pair.split(":"))
    for k in a.keys() & b.keys():
        if a[k][0] > 3e-6:
            x.append(np.log(b[k][1] / a[k][1]))
            y.append(np.log(b[k][0] / a[k][0]))
x, y = np.array(x), np.array(y)
apart = np.abs(x) > np.log(1.2)
print(f"{len(x)} kernels; raw std {y.std():.3f}, scaled {(y - x).std():.3f}")
print(f"{apart.sum()} whose TVM plan read over 1.2x apart; raw std {y[apart].std():.3f}, scaled {(y - x)[apart].std():.3f}")
