"""Baselines measured next to autofuse in the same run, with one timing protocol."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from autofuse.build import cpu_threads
from autofuse.build import no_garbage_collection
from autofuse.importer import InputSpec
from autofuse.importer import LoadedModel
from autofuse.importer import onnxruntime_session
from autofuse.importer import save_for_onnxruntime


def time_onnxruntime(
    model: onnx.ModelProto,
    specs: Sequence[InputSpec],
    feeds: Sequence[np.ndarray],
    repeat: int = 15,
    min_repeat_s: float = 0.02,
    threads: int = 0,
) -> list[float]:
    """Per-sample latencies (see `time_callable`) of onnxruntime (see `onnxruntime_runner`)."""
    return time_callable(onnxruntime_runner(model, specs, feeds, threads), repeat, min_repeat_s)


def onnxruntime_runner(
    model: onnx.ModelProto | str, specs: Sequence[InputSpec], feeds: Sequence[np.ndarray], threads: int = 0
) -> Callable[[], object]:
    """One inference of `model` (or of the ONNX file at that path) by onnxruntime per call: CPU
    provider, all graph optimisations, `threads` intra-op threads (0: build.cpu_threads(), as
    autofuse's kernels)."""
    sess = onnxruntime_session(model, threads or cpu_threads())
    inputs = {s.name: x for s, x in zip(specs, feeds)}
    return lambda: sess.run(None, inputs)


def time_callable(fn: Callable[[], object], repeat: int = 15, min_repeat_s: float = 0.02) -> list[float]:
    """Per-sample mean latency of `fn` in seconds (see `sampler`)."""
    sample = sampler(fn, min_repeat_s)
    with no_garbage_collection():
        return [sample() for _ in range(repeat)]


def sampler(fn: Callable[[], object], min_repeat_s: float = 0.02) -> Callable[[], float]:
    """A function taking one latency sample of `fn` per call, in seconds, with the sampling
    protocol of TVM's time_evaluator: warm-up calls, then each sample runs `fn` enough times
    to last at least `min_repeat_s` and returns the mean."""
    for _ in range(3):
        fn()
    number = 1
    while True:  # calibrate the calls per sample, as time_evaluator's min_repeat_ms does
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - t0 >= min_repeat_s or number >= 1 << 16:
            break
        number *= 2

    def sample() -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number

    return sample


def pool_rounds(rounds: Sequence[Any], default: Any = None) -> dict[str, Any]:
    """A baseline's Measurements, one per round of decision.measure_rounds (its samples taken in
    the round's worker before the plans'), pooled as the plans' are: status, median, noise
    (`spread`: the larger of the samples' spread and the drift of the per-round medians), error,
    and `vs_tvm_default` paired with `default` (TVM's plan's pooled Measurement: the same rounds,
    the same count; the k-th samples of a round are seconds apart, from the same process)."""
    failed = next((r for r in rounds if not r.ok), None)
    if failed is not None:  # a model onnxruntime cannot run (an operator it lacks): said, not a crash
        return {"status": failed.status, "median_s": None, "spread": None, "vs_tvm_default": None,
                "error": str(failed.error).strip().splitlines()[0][:200]}
    samples = [x for r in rounds for x in r.latencies_s]
    med, spread = median_and_spread(samples)
    meds = [r.median_s for r in rounds]
    drift = (max(meds) - min(meds)) / med if len(meds) > 1 else 0.0
    paired = None
    if default is not None and len(default.latencies_s) == len(samples):
        paired = statistics.median(d / o for d, o in zip(default.latencies_s, samples) if o > 0)
    return {"status": "ok", "median_s": med, "spread": max(spread or 0.0, drift), "vs_tvm_default": paired,
            "error": None}


def rounds_beside_onnxruntime(
    measurer: Any, plans: Sequence[Any], rounds: int, config: Any, model: onnx.ModelProto | None, default: Any
) -> tuple[Any, dict[str, Any] | None]:
    """decision.measure_rounds over `plans` (each round in a fresh worker of `measurer`), with
    onnxruntime running `model` in the worker before the plans (worker._measure_together).
    Returns the Rounds and onnxruntime's row (pool_rounds, paired with the plan `default`), or
    None for it without an ONNX model."""
    import tempfile

    from autofuse.decision import measure_rounds

    ort: list[Any] = []  # onnxruntime's Measurement, one per round
    with tempfile.TemporaryDirectory() as tmp:
        path = save_for_onnxruntime(model, tmp) if model is not None else None

        def measure_many(ps: list[Any], c: Any) -> list[Any]:
            if path is None:
                return measurer.measure_together(ps, config=c)
            got, baseline = measurer.measure_beside_onnxruntime(ps, path, config=c)
            ort.append(baseline)
            return got

        res = measure_rounds(measure_many, plans, rounds, config, between=measurer.restart, reference=default.key)
    return res, pool_rounds([ort[i] for i in res.kept], res.good.get(default.key)) if ort else None


def median_and_spread(samples: Sequence[float]) -> tuple[float, float | None]:
    med = statistics.median(samples)
    if len(samples) < 2:
        return med, None
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return med, (q[2] - q[0]) / med


def onnxruntime_agreement(loaded: LoadedModel, compute: Iterable[str], outputs: Sequence[np.ndarray],
                          feeds: Sequence[np.ndarray]) -> dict[str, Any]:
    """Whether the imported model computes what onnxruntime computes from the ONNX file.

    Plans are validated against the imported model's unfused outputs, so an operator TVM's
    frontend converts differently from onnxruntime would pass every plan unnoticed; this compares
    those outputs with onnxruntime's on the same inputs, at the tolerance of the least precise
    float type either side computes in (`compute`: the model's operator dtypes; onnxruntime rounds
    to float16 where the model says so even where the import upcasts it). {"match", "max_diff"},
    or {"error"} where onnxruntime cannot run the model.
    """
    from autofuse.importer import run_onnxruntime
    from autofuse.worker import compare
    from autofuse.worker import compute_dtype

    try:
        want = run_onnxruntime(loaded.onnx_model, loaded.inputs, feeds)  # type: ignore[arg-type]
    except Exception as err:
        return {"error": str(err).strip().splitlines()[0][:300]}
    ok, diff = compare(list(outputs), want, compute_dtype([*compute, loaded.upcast_from or "float32"]))
    return {"match": ok, "max_diff": diff}
