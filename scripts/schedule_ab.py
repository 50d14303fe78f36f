"""Time two versions of the rule-based schedules, kernel by kernel, in turns (A/B).

The kernels v11-v14 figures of benchmarks/JOURNAL.md came from this: dump each kernel's schedule under one
checkout, dump again under another, then time the kernels that differ, both versions compiled
into one library and timed alternately (median over ROUNDS, default 5; 2 threads as the worker).

    python scripts/schedule_ab.py dump OLD_DIR MODEL.onnx all [name:1x1x64x256 ...]  # at the old commit
    python scripts/schedule_ab.py dump NEW_DIR MODEL.onnx all [name:1x1x64x256 ...]  # at the new one
    TVM_NUM_THREADS=2 python scripts/schedule_ab.py time OLD_DIR NEW_DIR [--cold]

`seeds` instead of `all` dumps the kernels of TVM's plan and of the seed plans the tuner starts
from (SearchSpace.plus_kinds: its +horizontal, +anchors, ..., all_fused), each file named by
the kernel and a hash of its unscheduled TIR (the same kernel in several plans once); `diff -rq
OLD_DIR NEW_DIR` then names the kernels a change of the schedules touched (kernels v36).

(`PYTHONPATH=OLD_CHECKOUT python scripts/schedule_ab.py dump ...` dumps with another commit's
code; the inputs fix a model's dynamic dimensions as `autofuse tune --input` does.)
"""
import sys, os, numpy as np, tvm
if sys.argv[1] == "dump":
    from autofuse.apply import fuse
    from autofuse.build import make_target
    from autofuse.schedule import accumulators, schedule_candidates, unscheduled_kernels, vector_bits, vector_lanes
    from autofuse.importer import InputSpec
    from autofuse.workload import prepare
    out, model, names = sys.argv[2], sys.argv[3], sys.argv[4]
    os.makedirs(out, exist_ok=True)
    w = prepare(model, [InputSpec.parse(spec) for spec in sys.argv[5:]])
    plans = [w.tvm_default()]
    if names == "seeds":
        import hashlib
        from autofuse.space import SearchSpace, load_limits
        plans += SearchSpace(w.graph, load_limits()[1]).plus_kinds(plans[0])
    ks = {}
    for plan in plans:
        fused, _ = fuse(w.mod, w.graph, plan)
        for gv, f in unscheduled_kernels(fused).items():
            tag = "-" + hashlib.sha256(f.script().encode()).hexdigest()[:12] if names == "seeds" else ""
            ks[gv.name_hint + tag] = f
    bits = vector_bits(make_target("llvm"))  # this machine's vectors, as the measurement worker
    for n in (ks if names in ("all", "seeds") else names.split(",")):
        try:  # as build.schedule: a kernel no rule schedules stays as it is
            s = next(schedule_candidates(ks[n], vector_lanes(ks[n], bits), accumulators(bits)), ks[n])
        except Exception as e:  # noqa: BLE001
            print(f"{n}: left unscheduled ({type(e).__name__})")
            s = ks[n]
        open(f"{out}/{n}.py", "w").write(s.script())
    sys.exit()
from autofuse.build import kernel_args, make_target
a, b = sys.argv[2], sys.argv[3]; cold = "--cold" in sys.argv
t = make_target("llvm"); dev = tvm.cpu()
names = sorted({f[:-3] for f in os.listdir(a)} & {f[:-3] for f in os.listdir(b)})
only = len(os.listdir(a)) + len(os.listdir(b)) - 2 * len(names)
if only:  # a change before scheduling (the module's ops) renames kernels: those are not compared
    print(f"{only} kernels in one dump only, left out")
funcs = {}
for d in (a, b):
    for n in names:
        src = open(f"{d}/{n}.py").read()
        if d == b and src == open(f"{a}/{n}.py").read():
            continue
        funcs[(d, n)] = tvm.script.from_source(src).with_attr("global_symbol", f"k{len(funcs)}")
diff = sorted({n for d, n in funcs if d == b})
print(f"{len(diff)} of {len(names)} kernels differ")
if not diff:
    sys.exit()
mod = tvm.IRModule({f.attrs["global_symbol"]: f for f in funcs.values()})
lib = tvm.tirx.build(mod, target=t)
res = {k: [] for k in funcs}
rng = np.random.default_rng(0)
args = {n: kernel_args(funcs[(a, n)], dev, rng) for n in diff}
argsb = {n: kernel_args(funcs[(b, n)], dev, rng) for n in diff}
for r in range(int(os.environ.get("ROUNDS", 5))):
    for n in diff:
        for d, ar in ((a, args[n]), (b, argsb[n])):
            ev = lib.time_evaluator(funcs[(d, n)].attrs["global_symbol"], dev, number=1 if cold else 10, repeat=5, min_repeat_ms=0 if cold else 10,
                                    f_preproc="cache_flush_cpu_non_first_arg" if cold else "")
            res[(d, n)].append(np.median(ev(*ar).results) * 1e6)
ta = tb = 0
for n in diff:
    x, y = np.median(res[(a, n)]), np.median(res[(b, n)]); ta += x; tb += y
    print(f"{n:40s} {x:9.1f} {y:9.1f}  {x / y:5.2f}x")
print(f"{'sum':40s} {ta:9.1f} {tb:9.1f}  {ta / tb:5.2f}x")
