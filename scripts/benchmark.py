"""Benchmark suite: tune each model, then measure it side by side with every baseline, in one run.

    pip install -e ".[bench]"     # torch (CPU), transformers, onnxscript, matplotlib
    python scripts/benchmark.py                       # all models, rule-based kernel schedules
    python scripts/benchmark.py --models mlp,bert --trials 32 --kernel-trials 16

Models: graphs this project generates (mlp, conv_block, transformer_block, softmax/layer-norm
chains) and real architectures from `transformers`, instantiated from small configs with random
weights and exported with PyTorch's dynamo ONNX exporter. Baselines, all measured in this process
run on the same threads: TVM's stock pipeline (tvm.compile of the frontend's module, no
schedules), unfused and tvm_default (same kernel schedules as autofuse), autofuse tuned timed in turns,
onnxruntime (CPU provider, all graph optimisations) in the same worker before them, torch eager and torch.compile for the
PyTorch models. Writes benchmarks/results.json, benchmarks/RESULTS.md and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any

import numpy as np

from autofuse import models as builtin
from autofuse.baselines import median_and_spread
from autofuse.baselines import rounds_beside_onnxruntime
from autofuse.baselines import time_callable
from autofuse.build import MeasureConfig
from autofuse.build import cpu_threads
from autofuse.decision import SLOW_SPELL
from autofuse.importer import random_inputs
from autofuse.measure import IsolatedMeasurer
from autofuse.measure import Measurement
from autofuse.metrics import plan_metrics
from autofuse.search import TuneConfig
from autofuse.search import Tuner
from autofuse.tuning_log import TRIAL_ROLES
from autofuse.tuning_log import TuningLog
from autofuse.tuning_log import device_fingerprint
from autofuse.workload import prepare

sys.path.insert(0, str(Path(__file__).parent))
from hf_models import REAL  # noqa: E402
from hf_models import FULLSIZE  # noqa: E402
from hf_models import FULLSIZE_UNSEEN  # noqa: E402
from hf_models import UNSEEN  # noqa: E402
from hf_models import torch_model  # noqa: E402

GENERATED = ["mlp", "conv_block", "transformer_block", "norm_chain"]


# --- models ---------------------------------------------------------------------------------------


def norm_chain() -> Any:
    """Softmax and layer-norm chains written as primitive ONNX ops (reduction -> broadcast)."""
    g = builtin._Graph(0)
    h = "x"
    for _ in range(3):
        h = g.layer_norm(g.op("Add", [g.softmax(h), h]), 256)
    return g.model("norm_chain", {"x": (64, 256)}, h, (64, 256))


def export(name: str, out_dir: Path, opset: int | None = None) -> tuple[Path, Any]:
    path = out_dir / "models" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if name in builtin.BUILTIN or name == "norm_chain":
        import onnx

        onnx.save(norm_chain() if name == "norm_chain" else builtin.BUILTIN[name](), str(path))
        return path, None
    import torch

    model, args, names = torch_model(name)
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), input_names=names, output_names=["out"], dynamo=True,
                          verbose=False, opset_version=opset)
    return path, (model, args)


# --- timing of the baselines --------------------------------------------------------------------


def time_torch(model: Any, args: tuple[Any, ...], compiled: bool, repeat: int) -> list[float]:
    import torch

    torch.set_num_threads(cpu_threads())
    fn = torch.compile(model) if compiled else model
    with torch.inference_mode():
        return time_callable(lambda: fn(*args), repeat)


def time_tvm_stock(path: Path, feeds: list[np.ndarray], repeat: int) -> list[float]:
    """What a TVM user gets out of the box: the ONNX frontend's module (no onnxslim, none of
    autofuse's normalisation or schedules) compiled by `tvm.compile` with TVM's default CPU
    pipeline, run by the Relax VM in this process."""
    import tvm
    from tvm import relax

    from autofuse.build import make_target
    from autofuse.importer import load_model

    loaded = load_model(path, simplify=False)
    vm = relax.VirtualMachine(tvm.compile(loaded.mod, target=make_target("llvm")), tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in feeds]
    return time_callable(lambda: vm["main"](*args), repeat)


def machine_limits() -> dict[str, float]:
    """This machine's memory copy bandwidth and float32 GEMM throughput (numpy, all cores)."""
    a = np.ones(64 * 1024 * 1024 // 4, dtype=np.float32)
    b = np.empty_like(a)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        copies.append(time.perf_counter() - t0)
    n = 1024
    x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    gemms = []
    for _ in range(5):
        t0 = time.perf_counter()
        x @ x
        gemms.append(time.perf_counter() - t0)
    return {"bandwidth_Bps": 2 * a.nbytes / min(copies), "peak_flops": 2 * n**3 / min(gemms)}


# --- one model ----------------------------------------------------------------------------------


def side_by_side(
    w: Any, plans: dict[str, Any], scheduler: str, database: str, rounds: int, repeat: int
) -> tuple[dict[str, Any], int]:
    """The tuner's protocol (decision.measure_rounds): rounds in fresh processes, the plans timed
    in turns sample by sample, pooled median per plan, noise as the spread of per-round medians;
    onnxruntime's samples taken in the same worker before theirs (row 'onnxruntime').

    Rows with the same plan (autofuse keeping TVM's grouping) are one compiled artefact, measured
    once and reported under each name: timing it twice would only show the noise as a speedup
    or a slowdown. Returns the rows and the number of rounds left out as run in a slow spell of
    the host (decision.SLOW_SPELL), measured again."""
    with IsolatedMeasurer(w, config=MeasureConfig(repeat=repeat), scheduler=scheduler, database=database) as m:
        res, ort = rounds_beside_onnxruntime(m, list(plans.values()), rounds, MeasureConfig(repeat=repeat),
                                             w.loaded.onnx_model, plans["tvm_default"])
    out = {}
    for name, plan in plans.items():
        same = [n for n, p in plans.items() if p.key == plan.key and n != name]
        if plan.key in res.good:
            row = {"median_s": res.good[plan.key].median_s, "noise": res.noise[plan.key], "status": "ok"}
        else:
            bad = res.failed.get(plan.key)
            row = {"median_s": None, "noise": None, "status": f"{bad.status}: {bad.error}" if bad else "not run"}
        out[name] = {**row, "same_plan_as": same}
        if "tvm_default" in plans:
            out[name]["paired_vs_tvm_default"] = res.speedup(plans["tvm_default"].key, plan.key)
    out["onnxruntime"] = {"median_s": ort["median_s"], "noise": ort["spread"],
                          "status": "ok" if ort["status"] == "ok" else f"{ort['status']}: {ort['error']}",
                          "paired_vs_tvm_default": ort["vs_tvm_default"]}
    return out, res.slow_rounds


def trial_latencies(records: list[Any]) -> list[float]:
    """The tuner's trials in order, as the tuner compared them (Tuner.value): paired with TVM's
    plan and scaled to its latency in the first paired record, where they were paired."""
    ms = [Measurement.from_dict(r.measurement) for r in records if r.role in TRIAL_ROLES]
    anchor = next((m.default_s for m in ms if m.default_s), None)
    return [x for x in (m.at_default_s(anchor) for m in ms if m.ok) if x]


def trials_to_within(records: list[Any], frac: float = 0.02) -> int | None:
    lat = trial_latencies(records)
    if not lat:
        return None
    best = min(lat)
    running = math.inf
    for i, x in enumerate(lat, 1):
        running = min(running, x)
        if running <= best * (1 + frac):
            return i
    return None


def roofline_s(r: dict[str, Any], limits: dict[str, float]) -> float:
    """The model's time at this machine's limits: its minimum bytes (weights, inputs, outputs)
    at the copy bandwidth, or its FLOPs at the GEMM throughput, whichever takes longer."""
    return max(r["min_bytes"] / limits["bandwidth_Bps"], r["gflop"] * 1e9 / limits["peak_flops"])


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    out_dir = Path(args.out)
    t_export = time.perf_counter()
    path, torch_case = export(name, out_dir)
    w = prepare(path)
    log = TuningLog(out_dir / "logs")
    database = str(out_dir / "logs" / "metaschedule")
    cfg = TuneConfig(trials=args.trials, seed=0, kernel_trials=args.kernel_trials, kernel_plans=args.kernel_plans)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with IsolatedMeasurer(w, config=MeasureConfig(repeat=7), scheduler="rules", database=database,
                          pair_with_default=True) as m:
        result = Tuner(w, "llvm", m, log, cfg, scheduler="rules").run()
    tune_s = time.perf_counter() - t0
    peak_mb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rss_before,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    scheduler = result.summary.get("scheduler", "rules")
    plans = {"unfused": w.unfused(), "tvm_default": w.tvm_default(), "autofuse": result.best}
    rows, slow_rounds = side_by_side(w, plans, scheduler, database, rounds=args.rounds, repeat=args.repeat)
    glue = glue_share(w, scheduler, database)
    feeds = random_inputs(w.inputs)
    baselines = [("tvm_stock", lambda: time_tvm_stock(path, feeds, args.repeat))]
    if torch_case is not None:
        baselines += [(label, lambda c=compiled: time_torch(*torch_case, compiled=c, repeat=args.repeat))
                      for label, compiled in (("torch_eager", False), ("torch_compile", True))]
    for label, timing in baselines:
        try:
            med, spread = median_and_spread(timing())
            rows[label] = {"median_s": med, "noise": spread, "status": "ok"}
        except Exception as err:  # a baseline that fails is reported, not fatal
            rows[label] = {"median_s": None, "noise": None, "status": f"error: {str(err)[:200]}"}
    flops = sum(n.flops for n in w.graph.nodes)
    weights = sum(int(np.prod(i.dims)) * 4 for i in w.loaded.onnx_model.graph.initializer)
    io = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in w.inputs)
    io += sum(w.graph.nodes[n].bytes_out for n in w.graph.outputs)
    records = [r for r in log.records(w.key, "llvm") if r.study == result.study]  # this run's search
    metrics = {k: plan_metrics(w.graph, p).to_dict() for k, p in plans.items()}
    return {
        "model": name,
        "kind": "real" if torch_case is not None else "generated",
        "ops": len(w.graph),
        "inputs": [str(s) for s in w.inputs],
        "gflop": flops / 1e9,
        "results": rows,
        "rounds": args.rounds,
        "slow_rounds": slow_rounds,
        "metrics": metrics,
        "scheduler": scheduler,
        "decision": result.reason,
        "tuning_s": tune_s,
        "export_and_import_s": t0 - t_export,
        "peak_rss_mb": peak_mb,
        "measured_plans": result.measured,
        "trials_to_2pct": trials_to_within(records),
        "convergence_s": trial_latencies(records),
        "min_bytes": weights + io,
        "cost_model": result.summary["cost_model"],
        "cheap_vs_tuned_tau": result.summary.get("cheap_vs_tuned_tau"),
        "glue_share": glue,
    }


def glue_share(w: Any, scheduler: str, database: str) -> float | None:
    """The share of TVM's plan's kernel time (each kernel timed alone) spent in kernels with no
    matmul or convolution: the glue that fusion removes or hides. A GEMM already near the
    machine's peak gets no faster by fusion, so where glue is a few percent, no plan can be
    much faster than TVM's."""
    plan = w.tvm_default()
    with IsolatedMeasurer(w, config=MeasureConfig(repeat=5), scheduler=scheduler, database=database) as m:
        r = m.measure(plan, time_groups=True)
    if not r.ok or len(r.kernels) != len(plan.groups):
        return None
    total = glue = 0.0
    for group, key in zip(plan.groups, r.kernels):
        t = r.kernel_latencies_s.get(key, 0.0)
        total += t
        if not any(w.graph.nodes[n].is_anchor for n in group):
            glue += t
    return glue / total if total else None


# --- report -------------------------------------------------------------------------------------


def ratio(res: dict[str, Any], a: str, b: str) -> float | None:
    x, y = res["results"].get(a, {}).get("median_s"), res["results"].get(b, {}).get("median_s")
    return x / y if x and y else None


def vs_default(res: dict[str, Any]) -> float | None:
    """autofuse's speedup over tvm_default: paired over their samples timed in turns where
    available (decision.Rounds.speedup), else the ratio of the medians."""
    return res["results"]["autofuse"].get("paired_vs_tvm_default") or ratio(res, "tvm_default", "autofuse")


def geomean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def write_report(results: list[dict[str, Any]], limits: dict[str, float], out: Path, command: str) -> None:
    def us(x: float | None) -> str:
        return f"{x * 1e6:,.1f}" if x else "-"

    def fx(x: float | None) -> str:
        return f"{x:.2f}x" if x else "-"

    def roofline(r: dict[str, Any]) -> str:
        tuned = r["results"]["autofuse"]["median_s"]
        return f"{roofline_s(r, limits) / tuned:.0%}" if tuned else "-"

    def pct(x: float | None) -> str:
        return f"{x:.0%}" if x is not None else "-"

    def same(r: dict[str, Any]) -> str:
        return " (same plan)" if "tvm_default" in r["results"]["autofuse"].get("same_plan_as", ()) else ""

    rounds = " or ".join(sorted({str(r.get("rounds", 3)) for r in results}))  # runs before --rounds: three
    lines = [
        "# autofuse benchmark results",
        "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `{command}` on {device_fingerprint('llvm')} "
        f"(measured copy bandwidth {limits['bandwidth_Bps'] / 1e9:.1f} GB/s, numpy GEMM "
        f"{limits['peak_flops'] / 1e9:.0f} GFLOP/s). Latencies are medians of {rounds} rounds in one run of "
        "this script, each round in a fresh worker process in which onnxruntime is timed first and then the "
        "plans in turns, sample by sample, all on the same threads (each runtime's waiting threads slowed the "
        "other's samples when they took turns: scripts/runtime_interference.py); a round in which TVM's plan ran over "
        f"{SLOW_SPELL}x slower than in its usual round (the lower quartile of its rounds) ran in a slow spell of the host and was measured "
        f"again ({sum(r.get('slow_rounds', 0) for r in results)} such rounds in this run); 'noise' is the spread of the per-round medians (or of the samples, "
        "if larger); 'vs tvm_default' is paired: the median over the two plans' samples taken back to back "
        "of their ratio. 'glue' is the share of TVM's plan's kernel time (kernels timed alone) in kernels with no "
        "matmul or convolution: what fusion can remove or hide. The "
        "unfused and tvm_default rows use the same kernel schedules as autofuse's plan; where autofuse "
        "kept TVM's grouping ('same plan') the one compiled plan is measured once for both rows.",
        "",
        "| model | ops | tvm stock us | unfused us | tvm_default us | autofuse us | onnxruntime us | torch eager us "
        "| torch.compile us | vs tvm stock | vs tvm_default | vs onnxruntime | kernels (tvm/autofuse) | fusion ratio "
        "| KiB kept | tuning s | peak MB | trials to 2% | roofline | glue |",
        "|" + "---|" * 20,
    ]
    for r in results:
        res = r["results"]
        lines.append(
            f"| {r['model']} | {r['ops']} | {us(res.get('tvm_stock', {}).get('median_s'))} "
            f"| {us(res['unfused']['median_s'])} | {us(res['tvm_default']['median_s'])} "
            f"| {us(res['autofuse']['median_s'])} | {us(res['onnxruntime']['median_s'])} "
            f"| {us(res.get('torch_eager', {}).get('median_s'))} | {us(res.get('torch_compile', {}).get('median_s'))} "
            f"| {fx(ratio(r, 'tvm_stock', 'autofuse'))} "
            f"| {fx(vs_default(r))}{same(r)} | {fx(ratio(r, 'onnxruntime', 'autofuse'))} "
            f"| {r['metrics']['tvm_default']['kernels']}/{r['metrics']['autofuse']['kernels']} "
            f"| {r['metrics']['autofuse']['fusion_ratio']:.2f} | {r['metrics']['autofuse']['bytes_saved'] / 1024:,.0f} "
            f"| {r['tuning_s']:.0f} | {r['peak_rss_mb']:.0f} | {r['trials_to_2pct'] or '-'} "
            f"| {roofline(r)} | {pct(r.get('glue_share'))} |"
        )
    g_tvm = geomean([vs_default(r) for r in results])
    g_ort = geomean([ratio(r, "onnxruntime", "autofuse") for r in results])
    g_stock = geomean([ratio(r, "tvm_stock", "autofuse") for r in results])
    g_bound = geomean([1 / (1 - r["glue_share"]) for r in results if r.get("glue_share") is not None])
    def beyond_noise(r: dict[str, Any]) -> bool:  # slower by more than both rows' round-to-round noise
        res = r["results"]
        noise = max(res["autofuse"].get("noise") or 0, res["tvm_default"].get("noise") or 0)
        return (vs_default(r) or 1) < 1 - noise

    slower = [r["model"] for r in results if beyond_noise(r)]
    far = [r["model"] for r in results if (ratio(r, "onnxruntime", "autofuse") or 0) < 1 / 1.5]
    lines += [
        "",
        f"Geometric mean speedup over tvm_default (same schedules): **{fx(g_tvm)}** (target ≥ 1.15x); "
        f"models where autofuse measured slower beyond the noise: {', '.join(slower) or 'none'}.",
        f"Geometric mean of onnxruntime latency / autofuse latency: **{fx(g_ort)}** (1.00x = parity; target: "
        f"within 1.5x, i.e. ≥ 0.67x, on every model); models beyond 1.5x: {', '.join(far) or 'none'}.",
        "",
        f"Geometric mean speedup over TVM's stock pipeline (tvm.compile, no schedules): **{fx(g_stock)}**.",
        "",
        f"If every glue kernel of TVM's plan took no time and every matmul/conv kernel stayed as it is, TVM's "
        f"plan would be {fx(g_bound)} faster (geometric mean of 1 / (1 - glue)): the most fusion can gain "
        "over these models without also making their matmuls and convolutions faster.",
        "",
        "Decisions: " + "; ".join(f"{r['model']}: {r['decision']}" for r in results),
        "",
        "![latency](latency.png) ![convergence](convergence.png)",
    ]
    (out / "RESULTS.md").write_text("\n".join(lines) + "\n")
    plot(results, out)


def plot(results: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["unfused", "tvm_default", "autofuse", "onnxruntime", "torch_eager", "torch_compile"]  # stock: off scale
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(results)), 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        vals = []
        for r in results:
            base = r["results"]["tvm_default"]["median_s"]
            x = r["results"].get(label, {}).get("median_s")
            vals.append(x / base if x and base else 0)
        ax.bar(np.arange(len(results)) + i * width, vals, width, label=label)
    ax.set_xticks(np.arange(len(results)) + 0.4 - width / 2, [r["model"] for r in results], rotation=20)
    ax.set_ylabel("latency / tvm_default (lower is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=120)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        lat = r["convergence_s"]
        if lat:
            best = np.minimum.accumulate(lat)
            ax.plot(range(1, len(best) + 1), best / best[-1], label=r["model"])
    ax.set_xlabel("measured plan")
    ax.set_ylabel("best so far / final best")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all", help="comma list, 'generated', 'real', 'all' (both), 'unseen', 'fullsize' or "
                    "'fullsize_unseen'")
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--kernel-trials", type=int, default=0, help="MetaSchedule trials per kernel (0: off)")
    ap.add_argument("--kernel-plans", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5,
                    help="side-by-side rounds, each in a fresh worker (as many as the tuner's finals: with three, "
                         "one odd process moved norm_chain's paired reading from 1.04x to 0.85x)")
    ap.add_argument("--out", default="benchmarks")
    ap.add_argument("--export-only", action="store_true", help="write OUT/models/NAME.onnx and stop")
    ap.add_argument("--resume", action="store_true",
                    help="continue a run cut short: keep the models already in OUT/results.json, measure the rest")
    ap.add_argument("--opset", type=int, default=None,
                    help="ONNX opset of the torch exports (default: the exporter's; 23 writes Attention and RMSNormalization)")
    args = ap.parse_args()
    # the stock TVM baseline runs in this process: the same threads as the measurement worker
    # (TVM's own default on x86 is half the logical CPUs); set before TVM starts its thread pool
    os.environ["TVM_NUM_THREADS"] = str(cpu_threads())
    names = {"all": GENERATED + REAL, "generated": GENERATED, "real": REAL, "unseen": UNSEEN, "fullsize": FULLSIZE,
             "fullsize_unseen": FULLSIZE_UNSEEN}.get(
        args.models, args.models.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.export_only:
        for name in names:
            print(export(name, out, args.opset)[0])
        return
    limits = machine_limits()  # measured again at the end: the best of both (a busy moment only lowers them)
    results: list[dict[str, Any]] = []
    if args.resume and (out / "results.json").exists():
        before = json.loads((out / "results.json").read_text())
        results = [r for r in before["models"] if r["model"] in names]
        limits = {k: max(v, before["limits"].get(k, 0.0)) for k, v in limits.items()}
        print(f"resuming: {len(results)} of {len(names)} models already measured", file=sys.stderr)

    def save() -> None:  # after every model: a run cut short keeps what it measured
        (out / "results.json").write_text(json.dumps({"limits": limits, "models": results}, indent=1))
        write_report(results, limits, out, "python scripts/benchmark.py " + " ".join(sys.argv[1:]))

    for name in names:
        if any(r["model"] == name for r in results):
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        results.append(run_model(name, args))
        save()
    again = machine_limits()
    limits = {k: max(v, again[k]) for k, v in limits.items()}
    save()
    print((out / "RESULTS.md").read_text())


if __name__ == "__main__":
    main()
