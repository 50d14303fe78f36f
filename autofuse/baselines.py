"""Baselines measured next to autofuse in the same run: onnxruntime on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np
import onnx

from autofuse.importer import InputSpec


def time_onnxruntime(
    model: onnx.ModelProto,
    specs: Sequence[InputSpec],
    feeds: Sequence[np.ndarray],
    repeat: int = 15,
    min_repeat_s: float = 0.02,
    threads: int = 0,
) -> list[float]:
    """Per-sample mean latency in seconds of onnxruntime (CPU provider, all graph optimisations),
    with the same sampling protocol as TVM's time_evaluator: each sample runs the model enough
    times to last at least `min_repeat_s`."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    inputs = {s.name: x for s, x in zip(specs, feeds)}
    for _ in range(3):
        sess.run(None, inputs)
    number = 1
    while True:  # calibrate the calls per sample, as time_evaluator's min_repeat_ms does
        t0 = time.perf_counter()
        for _ in range(number):
            sess.run(None, inputs)
        if time.perf_counter() - t0 >= min_repeat_s or number >= 1 << 16:
            break
        number *= 2
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            sess.run(None, inputs)
        samples.append((time.perf_counter() - t0) / number)
    return samples


def median_and_spread(samples: Sequence[float]) -> tuple[float, float | None]:
    med = statistics.median(samples)
    if len(samples) < 2:
        return med, None
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return med, (q[2] - q[0]) / med
