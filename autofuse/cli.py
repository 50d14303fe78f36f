"""The `autofuse` command: tune, apply, show, bench, merge.

Commands are thin: they parse, call the library, print. Problems with the user's input (model,
log, target, search-space file) print one line `autofuse: error: ...` and exit with status 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from autofuse.importer import InputSpec
from autofuse.importer import ModelError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

ModelArg = Annotated[
    Optional[str],
    typer.Argument(help="ONNX or TVMScript (.py) file, or a built-in model name (default: the demo model)."),
]
InputOpt = Annotated[
    Optional[list[str]],
    typer.Option("--input", "-i",
                 help="Fix an input: name:1x3x224x224[:dtype], or its value too: name:shape:dtype=value. Repeatable."),
]
TargetOpt = Annotated[str, typer.Option(help="llvm, cuda, cuda:sm_XX or a JSON target dict.")]
LogDirOpt = Annotated[Path, typer.Option(help="Tuning log directory.")]


class UserError(Exception):
    """Bad input: printed as one line, exit status 2."""


def _fail(message: str) -> None:
    err.print(f"autofuse: error: {message}", soft_wrap=True)
    raise typer.Exit(2)


def _workload(model: str | None, inputs: list[str] | None, log_dir: Path, target: str) -> Any:
    from autofuse import models
    from autofuse.workload import prepare

    name = model or models.DEFAULT_MODEL
    path = Path(name)
    if not path.exists() and name in models.BUILTIN:
        path = models.write_builtin(name, log_dir / "models")
    specs = [InputSpec.parse(s) for s in inputs or []]
    return prepare(path, specs, target=target)


def _check_target(target: str) -> None:
    from autofuse.build import make_target

    make_target(target)


def _scheduler(target: str, scheduler: str | None) -> str:
    from autofuse.build import SCHEDULERS
    from autofuse.build import default_scheduler
    from autofuse.build import make_target

    if scheduler is not None and scheduler not in SCHEDULERS:
        raise UserError(f"unknown scheduler {scheduler!r}; choose from {', '.join(SCHEDULERS)}")
    return scheduler or default_scheduler(make_target(target))


def _run(fn: Any) -> Any:
    """Call fn, turning the library's user-facing errors into one-line exits."""
    from autofuse.batch import BatchError
    from autofuse.deploy import PlanNotFound
    from autofuse.tuning_log import LogError

    try:
        return fn()
    except (ModelError, LogError, PlanNotFound, UserError, FileNotFoundError, BatchError) as e:
        _fail(str(e))
    except ValueError as e:  # targets, space files, plan JSON
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)


def _fmt_us(seconds: float | None) -> str:
    if not seconds:
        return "-"
    return f"{seconds * 1e6:,.{2 if seconds < 1e-5 else 1}f} us"  # kernels under 10 us need the second digit


@app.command()
def tune(
    model: ModelArg = None,
    input: InputOpt = None,
    target: TargetOpt = "llvm",
    trials: Annotated[int, typer.Option(help="Measured plans in the study, seeds included.")] = 24,
    time_budget: Annotated[Optional[float], typer.Option(help="Wall-clock budget in seconds.")] = None,
    patience: Annotated[int, typer.Option(help="Stop after N measured trials without a new best (0: off).")] = 0,
    log_dir: LogDirOpt = Path("tuning_logs"),
    space: Annotated[str, typer.Option(help="Search-space file or name under search_spaces/.")] = "default",
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL (default: journal file in the log dir).")] = None,
    seed: int = 0,
    workers: Annotated[int, typer.Option(help="Processes sharing one study.")] = 1,
    strategy: Annotated[str, typer.Option(help="rules | search | model")] = "search",
    scheduler: Annotated[Optional[str], typer.Option(help="none | rules | dlight (default: rules on CPU, dlight on CUDA).")] = None,
    repeat: Annotated[int, typer.Option(help="Timed samples per measurement.")] = 7,
    timeout: Annotated[float, typer.Option(help="Seconds per plan build+run before it is a timeout.")] = 300.0,
    min_gain: Annotated[float, typer.Option(help="Minimum gain over tvm_default to replace it.")] = 0.02,
    finalize: Annotated[bool, typer.Option(help="Re-measure finalists and log the decision.")] = True,
    kernel_trials: Annotated[int, typer.Option(help="MetaSchedule trials per kernel for the finalists (0: off).")] = 0,
    kernel_plans: Annotated[int, typer.Option(help="Finalists besides tvm_default whose kernels are tuned.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Tune the fusion plan of MODEL on TARGET; results are appended to the tuning log."""
    from autofuse.build import MeasureConfig
    from autofuse.measure import IsolatedMeasurer
    from autofuse.search import STRATEGIES
    from autofuse.search import TuneConfig
    from autofuse.search import Tuner
    from autofuse.space import load_limits
    from autofuse.space import load_resource_limits
    from autofuse.tuning_log import TuningLog

    if strategy not in STRATEGIES:
        _fail(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    _run(lambda: _check_target(target))
    space_name, limits = _run(lambda: load_limits(space))
    resource_limits = _run(lambda: load_resource_limits(space))
    w = _run(lambda: _workload(model, input, log_dir, target))
    log = TuningLog(log_dir)
    _run(log.records)  # a corrupt log is reported before any work
    for warning in log.warnings:
        err.print(f"autofuse: warning: {warning}")
    build_only = target.startswith("cuda")
    config = TuneConfig(
        strategy=strategy, trials=trials, time_budget_s=time_budget, patience=patience, seed=seed,
        min_gain=min_gain, finalize=finalize and workers <= 1, kernel_trials=0 if build_only else kernel_trials,
        kernel_plans=kernel_plans,
    )
    scheduler = _run(lambda: _scheduler(target, scheduler))
    children = _spawn_workers(workers - 1, storage, log_dir) if strategy == "search" else []
    measure_cfg = MeasureConfig(repeat=repeat, timeout_s=timeout)
    database = str(log_dir / "metaschedule")
    with IsolatedMeasurer(w, target=target, config=measure_cfg, limits=limits, build_only=build_only,
                          scheduler=scheduler, database=database, resource_limits=resource_limits,
                          pair_with_default=True) as m:
        make = lambda cfg: Tuner(w, target, m, log, cfg, limits, space_name, scheduler, storage)  # noqa: E731
        tuner = make(config)
        if not as_json:
            out.print(f"[bold]{w.name}[/bold] ({w.key}) on {target}: {len(w.graph)} kernels unfused, "
                      f"{len(tuner.space)} fusion decisions ({len(tuner.space.tied)} search parameters), "
                      f"strategy {strategy}")
            for note in w.loaded.notes:  # what import did to the model (simplified, upcast, rewritten)
                out.print(f"  import: {note}", soft_wrap=True)
        result = _with_progress(tuner, trials, as_json)
        for child in children:
            child.wait()
        if children and finalize:
            result = make(config).finalize()
        agreement = _onnxruntime_agreement(w, m) if not build_only else None
    if as_json:
        summary = {**result.summary, "import_notes": w.loaded.notes, "onnxruntime_check": agreement}
        print(json.dumps(summary, indent=1))
    else:
        _print_summary(result.summary)
    if agreement and agreement.get("match") is False:
        err.print(f"autofuse: warning: the imported model differs from onnxruntime by up to "
                  f"{agreement['max_diff']:.2e} on random inputs, beyond tolerance: TVM's ONNX frontend may "
                  "convert an operator differently (plans are validated against the imported model)", soft_wrap=True)
    m = result.best_measurement
    if m.status not in ("ok", "built"):  # the job ran; no plan of the model works on this target
        err.print(f"autofuse: error: no plan of {w.name} built and ran correctly on {target} "
                  f"({m.status}: {m.error}); every attempt is recorded in {log_dir}", soft_wrap=True)
        raise typer.Exit(1)


def _onnxruntime_agreement(w: Any, m: Any) -> dict[str, Any] | None:
    """The imported model's unfused outputs against onnxruntime's (baselines.onnxruntime_agreement),
    None for a model that is not ONNX; a failure to check is reported, not raised."""
    from autofuse.baselines import onnxruntime_agreement

    if w.loaded.onnx_model is None:
        return None
    try:
        feeds, outputs = m.reference_outputs()
    except Exception as error:
        return {"error": f"reference run: {str(error).strip().splitlines()[0][:200]}"}
    return onnxruntime_agreement(w.loaded, (n.dtype for n in w.graph.nodes), outputs, feeds)


def _spawn_workers(n: int, storage: str | None, log_dir: Path) -> list[subprocess.Popen[bytes]]:
    if n <= 0:
        return []
    # the same command line, minus --workers: one search-only worker each
    args, skip = [], False
    for a in sys.argv[1:]:
        if not skip and a != "--workers" and not a.startswith("--workers="):
            args.append(a)
        skip = a == "--workers"
    cmd = [sys.executable, "-m", "autofuse.cli", *args, "--workers", "1", "--no-finalize", "--json"]
    return [subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for _ in range(n)]


def _with_progress(tuner: Any, trials: int, quiet: bool) -> Any:
    from rich.progress import BarColumn
    from rich.progress import MofNCompleteColumn
    from rich.progress import Progress
    from rich.progress import TextColumn
    from rich.progress import TimeElapsedColumn
    from rich.progress import TimeRemainingColumn

    if quiet:
        return tuner.run()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[best]}")]
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("tuning", total=trials, best="")

        def on_event(event: dict[str, Any]) -> None:
            if event["event"] == "tuning_kernels":
                bar.update(task, description=f"MetaSchedule {event['plan'].key}")
                return
            if event["event"] != "measured":
                return
            m = event["measurement"]
            if event["role"] in ("finalist", "best"):
                bar.update(task, description="final")
            else:
                bar.advance(task)
            best = event["best_s"]
            status = "" if m.ok else f" last: {m.status}"
            bar.update(task, best=f"best {_fmt_us(best)}{status}")

        tuner.progress = on_event
        return tuner.run()


def _print_summary(s: dict[str, Any]) -> None:
    lat, kern, ratio, saved = s["latency_s"], s["kernels"], s["fusion_ratio"], s["bytes_saved"]
    table = Table(title=f"{s['model']} — {s['strategy']}: {s['reason']}")
    for col in ("plan", "latency", "kernels", "fusion ratio", "bytes kept"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    noise = s["noise"]
    table.add_row("autofuse best", _fmt_us(lat["best"]) + (f" ±{noise['best'] * 50:.1f}%" if noise["best"] else ""),
                  str(kern["best"]), f"{ratio['best']:.2f}", f"{saved['best'] / 1024:,.1f} KiB")
    table.add_row("tvm_default", _fmt_us(lat["tvm_default"]) + (f" ±{noise['tvm_default'] * 50:.1f}%" if noise["tvm_default"] else ""),
                  str(kern["tvm_default"]), f"{ratio['tvm_default']:.2f}", f"{saved['tvm_default'] / 1024:,.1f} KiB")
    table.add_row("unfused", _fmt_us(lat["unfused"]), str(kern["unfused"]), "0.00", "0.0 KiB")
    out.print(table)
    cm = s["cost_model"]
    tau = f"{cm['kendall_tau']:.2f} over {cm['tau_pairs']} plans" if cm["kendall_tau"] is not None else "n/a"
    speed = f"{s['speedup_vs_tvm_default']:.3f}x" if s["speedup_vs_tvm_default"] else "-"
    out.print(f"speedup vs tvm_default: {speed}; measured {s['measured']} plans, screened "
              f"{s['screened_by_model']} by the cost model, {s['cache_hits']} cache hits, {s['wall_s']:.0f}s; "
              f"cost model: {cm['kernels_learned']} kernels, Kendall tau {tau}")


@app.command("apply")
def apply_cmd(
    model: ModelArg = None,
    input: InputOpt = None,
    target: TargetOpt = "llvm",
    log_dir: LogDirOpt = Path("tuning_logs"),
    output: Annotated[Path, typer.Option("-o", "--output", help="Library to write (.so).")] = Path("model.so"),
    strict: Annotated[bool, typer.Option(help="Fail instead of falling back to TVM's default fusion.")] = False,
) -> None:
    """Build MODEL with its cached best plan and export a deployable library."""
    from autofuse import deploy

    _run(lambda: _check_target(target))
    w = _run(lambda: _workload(model, input, log_dir, target))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = _run(lambda: deploy.export_library(w, target, log_dir, output, strict))
    for c in caught:
        if "tuned plan" in str(c.message):
            err.print(f"autofuse: warning: {c.message}")
    lat = f", measured {_fmt_us(chosen.latency_s)}" if chosen.latency_s else ""
    out.print(f"wrote {output} ({w.name} on {target}, {chosen.note}{lat}, {chosen.plan.num_kernels} kernels)")


@app.command()
def show(
    log_dir: LogDirOpt = Path("tuning_logs"),
    model: Annotated[Optional[str], typer.Option(help="Only this model key or name.")] = None,
    groups: Annotated[bool, typer.Option(help="Per-group table of each best plan.")] = True,
) -> None:
    """Best plans of a log, with a per-group table."""
    from autofuse.tuning_log import TuningLog

    log = TuningLog(log_dir)
    records = _run(log.records)
    for warning in log.warnings:
        err.print(f"autofuse: warning: {warning}")
    if not records:
        _fail(f"no records in {log.path}")
    keys = sorted({(r.model_key, r.model_name, r.target, r.scheduler) for r in records})
    keys = [k for k in keys if model in (None, k[0], k[1])]
    if not keys:
        _fail(f"no records for model {model!r} in {log.path}")
    for key, name, target, scheduler in keys:
        mine = [r for r in records if r.model_key == key and r.target == target]
        best = log.best(key, target, scheduler)
        ok = sum(r.status == "ok" for r in mine)
        out.print(f"[bold]{name}[/bold] ({key}) {target}/{scheduler}: {len(mine)} records, {ok} ok, "
                  f"failures {sorted({r.status for r in mine} - {'ok', 'built'})}")
        if best is None:
            out.print("  no validated plan")
            continue
        out.print(f"  best plan {best.plan_key} ({best.role}): {_fmt_us(best.median_s)}, "
                  f"{best.metrics.get('kernels')} kernels, fusion ratio {best.metrics.get('fusion_ratio', 0):.2f}")
        if groups:
            # a kernel is timed once per measurement run, with the first plan that has it
            lat = {k: v for r in mine if r.scheduler == scheduler
                   for k, v in (r.measurement.get("kernel_latencies_s") or {}).items()}
            _print_groups(best, lat)


def _print_groups(rec: Any, lat: dict[str, float]) -> None:
    table = Table()
    for col in ("group", "nodes", "kernel", "kernel time"):
        table.add_column(col)
    for i, g in enumerate(rec.groups):
        nodes = g["nodes"]
        text = ",".join(map(str, nodes[:8])) + ("…" if len(nodes) > 8 else "")
        table.add_row(str(i), text, str(g.get("kernel") or "-"), _fmt_us(lat.get(g.get("kernel") or "")))
    out.print(table)


@app.command()
def bench(
    model: ModelArg = None,
    input: InputOpt = None,
    target: TargetOpt = "llvm",
    log_dir: LogDirOpt = Path("tuning_logs"),
    repeat: int = 15,
    rounds: Annotated[int, typer.Option(help="Rounds, each in a fresh worker process, plans timed in turns.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON.")] = False,
) -> None:
    """unfused, tvm_default, autofuse tuned (and onnxruntime) side by side in one run."""
    from autofuse import deploy
    from autofuse.baselines import rounds_beside_onnxruntime
    from autofuse.build import cpu_threads
    from autofuse.build import MeasureConfig
    from autofuse.decision import SLOW_SPELL
    from autofuse.measure import IsolatedMeasurer
    from autofuse.metrics import plan_metrics

    _run(lambda: _check_target(target))
    if target.startswith("cuda"):
        _fail("bench runs on this machine's CPU; for CUDA use scripts/gpu_check.sh on a GPU host")
    w = _run(lambda: _workload(model, input, log_dir, target))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chosen = _run(lambda: deploy.choose_plan(w.key, w.graph, w.tvm_default(), log_dir, target, False, w.name))
    rows: list[dict[str, Any]] = []
    scheduler = chosen.scheduler or _scheduler(target, None)
    database = str(log_dir / "metaschedule")
    plans = (("unfused", w.unfused()), ("tvm_default", w.tvm_default()), ("autofuse", chosen.plan))
    config = MeasureConfig(repeat=max(3, repeat // max(1, rounds)))
    with IsolatedMeasurer(w, target=target, config=config, scheduler=scheduler, database=database) as m:
        # the tuner's protocol: rounds each in a fresh process (a process's memory layout alone
        # moved TVM's plan for transformer_block between 38 and 58 us), the plans timed in turns,
        # onnxruntime's samples in the same worker before theirs (worker._measure_together)
        res, ort = rounds_beside_onnxruntime(m, [p for _, p in plans], rounds, config, w.loaded.onnx_model,
                                             w.tvm_default())
    for label, plan in plans:
        r = res.good.get(plan.key) or res.failed.get(plan.key)
        pm = plan_metrics(w.graph, plan)
        rows.append({"name": label, "status": r.status if r else "runtime_error",
                     "median_s": r.median_s if r and r.ok else None, "spread": res.noise.get(plan.key),
                     "kernels": pm.kernels, "fusion_ratio": pm.fusion_ratio, "error": r.error if r else None,
                     "plan": plan.key, "vs_tvm_default": res.speedup(w.tvm_default().key, plan.key),
                     "per_round_s": res.per_round.get(plan.key)})  # a plan whose speed differs by process
    if ort is not None:
        rows.append({"name": "onnxruntime", **ort, "status": "ok" if ort["status"] == "ok" else "error"})
    result = {"model": w.name, "model_key": w.key, "target": target, "plan_source": chosen.note, "results": rows,
              "threads": cpu_threads(), "scheduler": scheduler, "rounds": res.ran, "slow_rounds": res.slow_rounds}
    if as_json:
        print(json.dumps(result, indent=1))
        return
    table = Table(title=f"{w.name} on {target}, {scheduler} schedules for all TVM rows ({chosen.note})")
    for col in ("", "latency", "±spread/2", "vs tvm_default", "kernels", "status"):
        table.add_column(col, justify="left" if col in ("", "status") else "right")
    base = next((r["median_s"] for r in rows if r["name"] == "tvm_default"), None)
    for r in rows:
        speedup = r.get("vs_tvm_default") or (base / r["median_s"] if base and r["median_s"] else None)
        ratio = f"{speedup:.3f}x" if speedup else "-"
        noise = f"{r['spread'] * 50:.1f}%" if r.get("spread") is not None else "-"
        table.add_row(r["name"], _fmt_us(r["median_s"]), noise, ratio, str(r.get("kernels", "-")),
                      r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error')}")
    out.print(table)
    if res.slow_rounds:
        out.print(f"{res.slow_rounds} of {res.ran} rounds ran in a slow spell of the host (tvm_default "
                  f"over {SLOW_SPELL}x its usual round): measured again, left out")


@app.command()
def merge(
    dest: Annotated[Path, typer.Argument(help="Log directory to merge into.")],
    sources: Annotated[list[Path], typer.Argument(help="Log directories or records.jsonl files.")],
) -> None:
    """Merge tuning logs from several machines; records already present are not duplicated."""
    from autofuse.tuning_log import TuningLog

    for src in sources:
        if not src.exists():
            _fail(f"log not found: {src}")
    log = TuningLog(dest)
    added = _run(lambda: log.merge_from(sources))
    for warning in log.warnings:
        err.print(f"autofuse: warning: {warning}")
    out.print(f"merged {added} new records into {log.path} ({len(log.records())} in all)")


@app.command("export-batch")
def export_batch_cmd(
    model: ModelArg = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Batch directory to write.")] = Path("batch"),
    input: InputOpt = None,
    target: TargetOpt = "cuda",
    plans: Annotated[int, typer.Option(help="How many candidate plans to export.")] = 12,
    log_dir: LogDirOpt = Path("tuning_logs"),
    space: Annotated[str, typer.Option(help="Search-space file or name under search_spaces/.")] = "gpu",
    scheduler: Annotated[Optional[str], typer.Option(help="Kernel scheduler (default: the target's).")] = None,
    seed: int = 0,
) -> None:
    """Compile candidate plans of MODEL into a batch that runner.py measures on another machine
    (TVM runtime only, or through TVM RPC); `autofuse ingest` brings the results back."""
    from autofuse.batch import candidate_plans
    from autofuse.batch import export_batch
    from autofuse.measure import IsolatedMeasurer
    from autofuse.space import SearchSpace
    from autofuse.space import load_limits
    from autofuse.space import load_resource_limits
    from autofuse.tuning_log import TuningLog

    _run(lambda: _check_target(target))
    _, limits = _run(lambda: load_limits(space))
    resource_limits = _run(lambda: load_resource_limits(space))
    w = _run(lambda: _workload(model, input, log_dir, target))
    log = TuningLog(log_dir)
    _run(log.records)
    sched = _run(lambda: _scheduler(target, scheduler))
    chosen = candidate_plans(w, SearchSpace(w.graph, limits), plans, target, log, seed)
    with IsolatedMeasurer(w, target=target, limits=limits, scheduler=sched, database=str(log_dir / "metaschedule"),
                          resource_limits=resource_limits) as m:
        manifest = _run(lambda: export_batch(m, chosen, out_dir, sched,
                                             lambda label, status: out.print(f"  {label:<28} {status}")))
    out.print(f"batch {manifest['batch']}: {len(manifest['entries'])} plans in {out_dir}, "
              f"{len(manifest['rejected'])} rejected here; measure with\n"
              f"  python {out_dir}/runner.py {out_dir} --out results.json\n"
              f"then: autofuse ingest {out_dir} results.json --log-dir {log_dir}")


@app.command()
def ingest(
    batch_dir: Annotated[Path, typer.Argument(help="The batch directory (its manifest.json).")],
    results: Annotated[Path, typer.Argument(help="runner.py's results JSON.")],
    log_dir: LogDirOpt = Path("tuning_logs"),
) -> None:
    """Append a remote batch's measurements to the tuning log (the search reads them)."""
    from autofuse.batch import ingest as ingest_results
    from autofuse.tuning_log import TuningLog

    log = TuningLog(log_dir)
    _run(log.records)
    n = _run(lambda: ingest_results(log, batch_dir, results))
    out.print(f"ingested {n} records into {log.path}")


def main() -> None:
    app(prog_name="autofuse")


if __name__ == "__main__":
    main()
