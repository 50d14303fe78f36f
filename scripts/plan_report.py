"""Print a model's op graph summary and measure a few fusion plans side by side.

Plans: unfused, tvm_default (TVM FuseOps' grouping), the seed plans the tuner starts from
(SearchSpace.plus_kinds: TVM's plan plus every horizontal, every reduction->broadcast, every
merge of two anchored groups, every matmul/conv epilogue past a reshape, and every fusion), and
TVM's plan plus the decisions given with --plus. Every plan is built in one isolated worker,
checked against the unfused reference, and the plans are timed in turns, sample by sample;
'vs tvm_default' is the median of the paired ratios. With --kernels, each kernel is also timed alone: TVM's plan's N slowest, and for every
other plan the kernels it has that TVM's plan has not.

    python scripts/plan_report.py [MODEL] [--input name:1x3x224x224] [--target llvm] [--kernels N]
                                  [--plus v:24-25,v:27-29]

MODEL is an ONNX or TVMScript file, or the name of a built-in model (default:
transformer_block).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autofuse import models
from autofuse.build import MeasureConfig
from autofuse.decision import paired_speedup
from autofuse.importer import InputSpec
from autofuse.measure import IsolatedMeasurer
from autofuse.metrics import plan_metrics
from autofuse.space import SearchSpace
from autofuse.workload import prepare


def candidate_plans(space, tvm_default):
    return [space.decode({}, "unfused"), tvm_default, *space.plus_kinds(tvm_default)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=models.DEFAULT_MODEL)
    ap.add_argument("--input", action="append", default=[], type=InputSpec.parse)
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also time each kernel alone: TVM's plan's N slowest, and every other plan's own")
    ap.add_argument("--plus", action="append", default=[], metavar="IDS",
                    help="also measure TVM's plan with these decisions taken (comma list of ids, e.g. v:24-25)")
    args = ap.parse_args()
    console = Console(width=120)
    source = Path(args.model)
    if not source.exists() and args.model in models.BUILTIN:
        source = models.write_builtin(args.model, tempfile.mkdtemp(prefix="autofuse-"))
    w = prepare(source, args.input)
    for note in w.loaded.notes:
        console.print(f"[dim]{note}[/dim]")
    summary = w.graph.summary()
    console.print(f"[bold]{w.name}[/bold] key={w.key} inputs={', '.join(map(str, w.inputs))}")
    console.print(
        f"op graph: {summary['nodes']} kernels, {summary['edges']} edges, "
        f"{summary['gflops']:.4f} GFLOP, kinds {summary['kinds']}"
    )
    space = SearchSpace(w.graph)
    kinds = {}
    for d in space.decisions:
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    console.print(f"plan space: {len(space)} decisions {kinds}")
    table = Table(title=f"plans on {args.target} (median of {args.repeat} samples)")
    for col in ("plan", "kernels", "fusion", "bytes kept", "compile s", "latency us", "±IQR/2", "vs tvm_default",
                "status"):
        table.add_column(col, justify="left" if col in ("plan", "status") else "right")
    build_only = args.target.startswith("cuda")
    config = MeasureConfig(repeat=args.repeat)
    base = w.tvm_default()
    plans = candidate_plans(space, base)
    for ids in args.plus:
        unknown = [i for i in ids.split(",") if i not in space.by_id]
        if unknown:
            ap.error(f"no such decision(s) {unknown}; e.g. {space.decisions[0].id}")
        plans.append(space.decode({**space.encode(base), **dict.fromkeys(ids.split(","), True)}, f"{base.name}+{ids}"))
    with IsolatedMeasurer(w, target=args.target, config=config, build_only=build_only) as m:
        # all plans in one worker, timed in turns: side by side, as the tuner compares them
        results = m.measure_together(plans, time_groups=bool(args.kernels) and not build_only)
    timed = {plan.name: (plan, r) for plan, r in zip(plans, results)}
    base_r = timed[base.name][1]
    for plan, r in zip(plans, results):
        pm = plan_metrics(w.graph, plan)
        paired = paired_speedup(base_r, r) if r.ok and base_r.ok else None
        table.add_row(
            plan.name,
            str(pm.kernels),
            f"{pm.fusion_ratio:.2f}",
            f"{pm.bytes_saved / 1024:.1f} KiB",
            f"{r.compile_s:.2f}" if r.compile_s else "-",
            f"{r.median_s * 1e6:.1f}" if r.median_s else "-",
            f"±{r.spread * 50:.1f}%" if r.spread is not None else "-",
            f"{paired:.3f}x" if paired else "-",
            r.status if r.status in ("ok", "built") else f"{r.status}: {r.error}",
        )
    console.print(table)
    if args.kernels and not build_only:
        _print_kernels(console, w, *timed[base.name], args.kernels, "kernels alone", ())
        for name, (plan, r) in timed.items():
            if name not in ("unfused", base.name):
                _print_kernels(console, w, plan, r, len(plan.groups), "kernels not in tvm_default", base.groups)


def _print_kernels(console, w, plan, m, n, title, skip):
    """A plan kernel by kernel (each kernel alone, on random buffers), slowest first; groups in
    `skip` are left out."""
    rows = {}
    for group, key in zip(plan.groups, m.kernels or ()):
        if group not in skip and key in m.kernel_latencies_s:
            ops = "+".join(w.graph.nodes[i].op for i in group)
            calls, _ = rows.get(key, (0, ops))
            rows[key] = (calls + 1, ops)
    if not rows:
        return
    total = sum(m.kernel_latencies_s[k] * c for k, (c, _) in rows.items())
    console.print(f"{plan.name} {title}: {total * 1e6:.1f} us in all; slowest:")
    for key, (calls, ops) in sorted(rows.items(), key=lambda kv: -m.kernel_latencies_s[kv[0]] * kv[1][0])[:n]:
        console.print(f"  {m.kernel_latencies_s[key] * 1e6:8.1f} us x{calls}  {ops[:90]}")


if __name__ == "__main__":
    main()
