"""Schedule, compile and run a fused Relax module: targets, schedulers, lowering, timing.

The pipeline here is TVM's default one minus what `tvm_bridge.normalize` and `apply.apply_plan`
already did (legalize, FuseOps, FuseTIR): running FuseOps again would re-fuse our groups.
Kernels are scheduled first (`schedule`), then lowered to the Relax VM.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

TARGET_ALIASES = {"cpu": "llvm", "gpu": "cuda"}


def host_cpu() -> str:
    """LLVM's name for this machine's CPU (e.g. znver4): kernels use its full vector ISA."""
    from tvm.target import codegen

    try:
        return str(codegen.llvm_get_system_cpu())
    except Exception:
        return "generic"


def cpu_threads() -> int:
    """Threads every CPU measurement runs with, autofuse's and the baselines' alike: one per
    physical core this process may use (what onnxruntime and PyTorch default to).

    TVM's own default, without TVM_NUM_THREADS, halves the logical CPU count on x86 to skip
    hyper-threads; on a 2-vCPU machine that is one thread, and every parallel loop then pays
    the thread pool's launch cost for nothing (ResNet measured 275 us that way, 108 us with two
    threads). The measurement worker therefore always sets TVM_NUM_THREADS.
    """
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for cpu in allowed:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topo}/physical_package_id") as pkg, open(f"{topo}/core_id") as core:
                cores.add((pkg.read().strip(), core.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def make_target(spec: str) -> tvm.target.Target:
    """A Target from 'llvm', 'cpu', 'cuda', 'cuda:sm_80' or a JSON target dict.

    'llvm' means this machine's CPU (`mcpu` = the host, as -march=native: a library built for
    it may not run on an older CPU; pass a JSON dict such as '{"kind": "llvm", "mcpu":
    "x86-64-v3"}' for a portable build). CPU targets get `num-cores` (MetaSchedule needs it);
    CUDA defaults to sm_90 (H200/H100).
    """
    spec = TARGET_ALIASES.get(spec, spec)
    if spec.startswith("{"):
        config = json.loads(spec)
    elif spec == "llvm":
        config = {"kind": "llvm", "num-cores": os.cpu_count() or 1, "mcpu": host_cpu()}
    elif spec.split(":")[0] == "cuda":
        arch = spec.split(":", 1)[1] if ":" in spec else "sm_90"
        config = {"kind": "cuda", "arch": arch, "host": {"kind": "llvm"}}
    else:
        raise ValueError(f"unknown target {spec!r}; use llvm, cuda, cuda:sm_XX or a JSON dict")
    try:
        return tvm.target.Target(config)
    except Exception as err:
        raise ValueError(f"invalid target {spec!r}: {err}") from err


def target_name(target: tvm.target.Target) -> str:
    """Short stable name for logs: 'llvm' or 'cuda:sm_90'."""
    if target.kind.name == "cuda":
        return f"cuda:{target.attrs.get('arch', 'sm_90')}"
    return str(target.kind.name)


SCHEDULERS = ("none", "rules", "metaschedule", "dlight")


def default_scheduler(target: tvm.target.Target) -> str:
    return "dlight" if target.kind.name == "cuda" else "rules"


def schedule(
    fused: tvm.IRModule,
    target: tvm.target.Target,
    scheduler: str,
    database: str | None = None,
) -> tvm.IRModule:
    """Give every kernel of a fused module a schedule.

    - none: as TVM's default CPU pipeline does (serial loop nests);
    - rules: autofuse's rule-based CPU schedule (schedule.py), milliseconds per kernel;
    - metaschedule: kernels found in the MetaSchedule `database` (a work dir) get their tuned
      schedule, the rest the rule-based one;
    - dlight: DLight's GPU rules (Matmul, GEMV, Reduction, GeneralReduction, Fallback), as TVM's
      own CUDA pipeline.
    """
    from autofuse.schedule import split_unit_reductions_in

    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose from {SCHEDULERS}")
    fused = split_unit_reductions_in(fused)  # TIR's inlining miscompiles them under every scheduler
    with target, tvm.transform.PassContext(opt_level=3):  # some passes read the target on creation
        passes = _schedule_passes(target, scheduler, database)
        return tvm.transform.Sequential(passes)(fused) if passes else fused


def _schedule_passes(target: tvm.target.Target, scheduler: str, database: str | None) -> list[tvm.transform.Pass]:
    if scheduler == "dlight" or target.kind.name == "cuda":
        return [DLightWithFallback()]
    if scheduler == "none":
        return []
    from autofuse.schedule import ScheduleCPU
    from autofuse.schedule import vector_bits

    passes: list[tvm.transform.Pass] = []
    if scheduler == "metaschedule" and database and os.path.exists(os.path.join(database, "database_workload.json")):
        passes.append(relax.transform.MetaScheduleApplyDatabase(database))
    return passes + [ScheduleCPU(vector_bits(target), prepack=False)]  # compile_scheduled packs


@tvm.transform.module_pass(opt_level=0, name="AutofuseDLight")
class DLightWithFallback:
    """DLight's GPU rules (Matmul, GEMV, Reduction, GeneralReduction, Fallback) kernel by kernel,
    where a rule that raises on a fused kernel passes it on to the next rule instead of failing
    the whole module (DLight's own pass stops at the first exception). A kernel no rule
    schedules is an error: unscheduled, TVM would quietly compile it for the host CPU. A rule can
    also leave a kernel that fails later, in lowering (e.g. Matmul on a matmul fused with a split:
    "buffer used before its definition"), so each scheduled kernel is lowered alone through TIR's
    pipeline (milliseconds, no code generation) before it is accepted. Run inside `with target`."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from tvm import tirx
        from tvm.s_tir import dlight as dl

        from autofuse.schedule import SCHEDULED_ATTR

        rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
        target = tvm.target.Target.current()
        pipeline, _, _ = tirx.get_default_tir_pipeline(target)
        bind = tirx.transform.BindTarget(target.with_host(target.host or "llvm"))
        lower = lambda m: pipeline(bind(m))  # noqa: E731 - TIR's passes, no code generation
        out = mod.clone()
        with _refusals_unrendered():
            for gv, func in mod.functions.items():
                if not isinstance(func, tirx.PrimFunc) or func.attrs and SCHEDULED_ATTR in func.attrs:
                    continue
                for rule in rules:
                    try:
                        one = dl.ApplyDefaultSchedule(rule)(tvm.IRModule({gv: func}))
                    except Exception:  # the rule cannot schedule this kernel: try the next one
                        continue
                    scheduled = one[gv.name_hint]
                    if scheduled.attrs and SCHEDULED_ATTR in scheduled.attrs and _lowers(gv, scheduled, lower):
                        out[gv] = scheduled
                        break
                else:
                    raise ValueError(f"no DLight rule schedules kernel {gv.name_hint} for the GPU")
        return out


@contextlib.contextmanager
def _refusals_unrendered() -> Iterator[None]:
    """Schedules created meanwhile (DLight's rules make their own) do not print the kernel into
    each refused primitive's error, as `schedule.new_schedule`'s do not: a rule tries
    primitives and takes refusals as answers, and on a 256-operator kernel DLight's Fallback
    took 400 s rendering them."""
    from tvm.s_tir.schedule import schedule as module

    parse = getattr(module, "_parse_error_render_level", None)
    if parse is None:  # a TVM that renamed it: rules run as they are, slower to refuse
        yield
        return
    module._parse_error_render_level = lambda _level: parse("none")
    try:
        yield
    finally:
        module._parse_error_render_level = parse


def _lowers(gv: tvm.ir.GlobalVar, func: tvm.tirx.PrimFunc, lower: Callable[[tvm.IRModule], object]) -> bool:
    """Whether `lower` accepts the kernel alone (a scheduled kernel can pass TIR's schedule
    checks and still fail in lowering)."""
    try:
        lower(tvm.IRModule({gv: func.with_attr("global_symbol", gv.name_hint)}))
    except Exception:  # noqa: BLE001 - any failure means: not this schedule
        return False
    return True


def _lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline as backend
    else:
        from tvm.relax.backend.cpu_generic import pipeline as backend  # type: ignore[no-redef]
    return backend.dataflow_lower_passes(target) + backend.finalize_passes(target)


def _noalias_where_nothing_can_alias(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every PrimFunc that takes at most one pointer marked "tirx.noalias" (it has
    nothing to alias), as TVM's kernels are.

    TVM's LLVM codegen (CodeGenLLVM::DeclareFunctionInternal, 0.27) reads that flag as it declares
    a function, and declares all of a module's functions, sorted by symbol, before it emits any:
    every function is emitted with the flag of the last symbol. VMShapeLower's shape functions
    (one buffer, the shape heap) lack it, so in a model with run-time sizes whose kernel names
    all sort before "shape_func", every kernel lost its noalias pointers and LLVM reloaded what it
    had hoisted out of loops: RoiAlign over 64 boxes ran 23.6 ms instead of 4.5 (the same kernel
    built beside a shape function and alone)."""
    marked = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and not func.attrs.get("tirx.noalias", False) \
                and sum(not _is_scalar(p) for p in func.params) <= 1:
            marked[gv] = func.with_attr("tirx.noalias", True)
    if not marked:
        return mod
    functions = {gv: marked.get(gv, func) for gv, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _is_scalar(param: tvm.tirx.Var) -> bool:
    return isinstance(param.ty, tvm.ir.PrimType) and str(param.ty.dtype) != "handle"


def build(
    fused: tvm.IRModule,
    target: tvm.target.Target,
    scheduler: str | None = None,
    database: str | None = None,
    exec_mode: str | None = None,
) -> tvm.runtime.Executable:
    """Schedule (see `schedule`) and compile an already fused module (apply.apply_plan's output).

    `scheduler` None means the target's default: rules on the CPU, DLight on CUDA. `exec_mode`:
    see compile_scheduled.
    """
    scheduled = schedule(fused, target, scheduler or default_scheduler(target), database)
    return compile_repairing(fused, scheduled, target, exec_mode)[0]


def compile_repairing(
    fused: tvm.IRModule, scheduled: tvm.IRModule, target: tvm.target.Target, exec_mode: str | None = None
) -> tuple[tvm.runtime.Executable, tvm.IRModule]:
    """compile_scheduled, and if that fails on the CPU, give each kernel that does not lower
    alone the next rule-based schedule that does (schedule.schedule_candidates; the plain loop
    nest last), then compile again. Returns the executable and its kernels as compiled
    (compile_scheduled). Checking kernels one by one costs ~40 ms each, so it only runs once a
    build failed."""
    try:
        return compile_scheduled(scheduled, target, fused, exec_mode)
    except Exception:
        if target.kind.name != "llvm":
            raise
        repaired = _repair_kernels(fused, scheduled, target)
        if repaired is None:
            raise
    return compile_scheduled(repaired, target, fused, exec_mode)


def _repair_kernels(fused: tvm.IRModule, scheduled: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule | None:
    from tvm import tirx

    from autofuse.schedule import SCHEDULED_ATTR
    from autofuse.schedule import accumulators
    from autofuse.schedule import schedule_candidates
    from autofuse.schedule import vector_bits
    from autofuse.schedule import vector_lanes

    def lower(m: tvm.IRModule) -> object:  # on the CPU the TIR passes need the whole build
        return tirx.build(m, target=target)

    out, changed = scheduled.clone(), False
    bits = vector_bits(target)
    for gv, func in scheduled.functions.items():
        if not isinstance(func, tirx.PrimFunc) or gv.name_hint not in fused or _lowers(gv, func, lower):
            continue
        plain = fused[gv.name_hint]
        try:
            candidates = schedule_candidates(plain, vector_lanes(plain, bits), accumulators(bits))
            out[gv] = next((c for c in candidates if _lowers(gv, c, lower)), plain.with_attr(SCHEDULED_ATTR, True))
        except Exception:  # noqa: BLE001 - a rule that raises: the plain loop nest always lowers
            out[gv] = plain.with_attr(SCHEDULED_ATTR, True)
        changed = True
    return out if changed else None


# the most calls `main` may make for it to be compiled rather than interpreted (see
# compile_scheduled). LLVM's time on the one straight-line host function grows faster than its
# length (a narrow 48-layer BERT's 2,809 calls: 0.6 -> 15.0 s to build, 24 layers: 0.5 -> 2.8 s),
# and the one model measured beyond this, RWKV (2,429 calls), ran 10-30% slower compiled
COMPILED_MAX_CALLS = 1000


def compile_scheduled(
    scheduled: tvm.IRModule, target: tvm.target.Target, fused: tvm.IRModule | None = None,
    exec_mode: str | None = None,
) -> tuple[tvm.runtime.Executable, tvm.IRModule]:
    """Lower and compile a scheduled module: constant weights re-laid for their kernels, kernel
    outputs written over inputs nothing reads afterwards where `fused` (the module before
    scheduling) is given (inplace.py), then TVM's VM lowering. Returns the executable and the
    module its kernels were compiled from (after those two steps: the signatures the
    executable's library holds, which time_kernels times).

    `exec_mode` "compiled" (TVM's VMTIRCodeGen) compiles `main`'s calls between kernels
    (allocations, releases, tuples) into one host function beside the kernels, where "bytecode"
    (tvm.compile's default) has the VM interpret them an instruction at a time. A small model
    spends much of its time there: Mamba's TVM plan makes 557 such calls beside 226 kernel
    calls a run (scripts/exec_mode_ab.py). None: "compiled" on the CPU where `main` makes at
    most COMPILED_MAX_CALLS calls, "bytecode" otherwise (and on GPUs, where the compiled form
    has not run yet). Should the compiled form not build, the bytecode one is built instead."""
    from autofuse.inplace import reuse_dead_inputs
    from autofuse.schedule import pack_constants
    from autofuse.tvm_bridge import count_calls

    if exec_mode not in (None, "compiled", "bytecode"):
        raise ValueError(f"exec_mode {exec_mode!r}: 'compiled' or 'bytecode'")
    with target:
        mod = pack_constants(scheduled)
        if fused is not None:
            mod = reuse_dead_inputs(mod, fused)
        lowered = _noalias_where_nothing_can_alias(tvm.transform.Sequential(_lowering_passes(target))(mod))
    if exec_mode is None:
        small = target.kind.name == "llvm" and count_calls(lowered) <= COMPILED_MAX_CALLS
        exec_mode = "compiled" if small else "bytecode"
    if exec_mode == "compiled":
        try:
            return relax.build(lowered, target=target, relax_pipeline=None, exec_mode="compiled"), mod
        except Exception:  # noqa: BLE001 - built again as bytecode, where a kernel that does not lower raises
            pass
    return relax.build(lowered, target=target, relax_pipeline=None), mod


def device_for(target: tvm.target.Target) -> tvm.runtime.Device:
    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)


@dataclass(frozen=True)
class MeasureConfig:
    """How a compiled plan is timed.

    One untimed warm-up call, then `repeat` timed samples, each the mean of `number` calls or
    more: as many as fill `min_repeat_ms` (TVM's time_evaluator raises the count). The median of
    the samples is the latency; the interquartile range relative to it is the stated noise.
    `number` is 1: a model of a few microseconds gets thousands of calls a sample from
    `min_repeat_ms` alone, and a large one is not run five times a sample for nothing
    (ResNet-50 at 224, 90 ms a call: a search trial paired with TVM's plan took 11.7 s, 7.7 of
    them in 16 samples of 0.46 s).
    """

    number: int = 1
    repeat: int = 7
    min_repeat_ms: int = 20
    warmup: int = 1
    timeout_s: float = 300.0


def run(ex: tvm.runtime.Executable, dev: tvm.runtime.Device, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs])
    return [o.numpy() for o in _flatten(out)]


def _flatten(out: object) -> list[tvm.runtime.Tensor]:
    if hasattr(out, "numpy"):
        return [out]  # type: ignore[list-item]
    return [t for item in out for t in _flatten(item)]  # type: ignore[attr-defined]


def time_latency(
    ex: tvm.runtime.Executable,
    dev: tvm.runtime.Device,
    inputs: Sequence[np.ndarray],
    config: MeasureConfig,
) -> list[float]:
    """Per-sample latencies in seconds (`config.repeat` samples, after warm-up)."""
    return time_interleaved([ex], dev, inputs, config)[0]


def time_interleaved(
    executables: Sequence[tvm.runtime.Executable],
    dev: tvm.runtime.Device,
    inputs: Sequence[np.ndarray],
    config: MeasureConfig,
) -> list[list[float]]:
    """`config.repeat` latency samples of each executable, taken in turns (sample i of every
    plan, the order rotated each time), so that the k-th samples of all plans are neighbours in
    time. (Not so with another runtime: see worker._measure_together.) On a shared host a slow spell
    lasts from milliseconds to seconds: plans timed one after the other were judged in different
    spells (BERT's two best plans: per-plan medians 2% apart, per-round gains from -48% to +4%),
    while neighbouring samples share it (the same two plans differed by 2.0-2.8% in every
    process)."""
    vms = [relax.VirtualMachine(ex, dev) for ex in executables]
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    timers = []
    for vm in vms:
        for _ in range(config.warmup):
            vm["main"](*args)
        timers.append(vm.time_evaluator("main", dev, number=config.number, repeat=1,
                                        min_repeat_ms=config.min_repeat_ms))
    takes = [lambda t=t: float(t(*args).results[0]) for t in timers]
    samples: list[list[float]] = [[] for _ in takes]
    order = list(range(len(takes)))
    with no_garbage_collection():
        for take in takes:  # a turn discarded: the first samples after a build ran slow (1.5x)
            take()
        for r in range(config.repeat):
            for i in order[r % len(order):] + order[: r % len(order)]:
                samples[i].append(takes[i]())
    return samples


@contextlib.contextmanager
def no_garbage_collection() -> Iterator[None]:
    """Python's garbage collector off while samples are taken, as `timeit` does: a baseline
    timed from Python (onnxruntime) paid its collections in a few samples, after a build had
    left millions of objects (PP-OCRv4 det: samples of 60 ms with some of 112-143)."""
    import gc

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def kernel_hash(mod: tvm.IRModule, name: str) -> str:
    """Structural hash of one PrimFunc, independent of its name: groups recur across plans."""
    from tvm_ffi import structural_hash

    prim = mod[name].with_attr("global_symbol", "kernel")
    return f"{structural_hash(prim) & 0xFFFFFFFFFFFFFFFF:016x}"


def kernel_args(prim: tvm.tirx.PrimFunc, dev: tvm.runtime.Device, rng: np.random.Generator) -> list:
    """Buffers to run one PrimFunc alone: random floats, zeros for integers (indices stay in
    bounds)."""
    args = []
    for buf in prim.params:  # in TVM 0.27 a PrimFunc's params are its buffers
        shape = [int(d) for d in buf.shape]
        data = rng.standard_normal(shape) if "float" in str(buf.dtype) else np.zeros(shape)
        args.append(tvm.runtime.tensor(data.astype(str(buf.dtype)), dev))
    return args


def time_kernels(
    ex: tvm.runtime.Executable, compiled: tvm.IRModule, names: Sequence[str], dev: tvm.runtime.Device,
    config: MeasureConfig,
) -> dict[str, float]:
    """Median latency of each named kernel run alone on random buffers, taken from the plan's
    own executable (`compiled`: its kernels as compile_scheduled built them); kernels of
    run-time sizes, and any the library does not hold, are left out (schedule.static_buffers).

    This is what the cost model learns from: per-group kernel time, the same kernel measured
    once however many plans contain it. Compiling the kernels again apart had cost as much as
    the plan's own build (RWKV: 10 s to compile and 9 s to load 89 kernels, 3 s to time them).
    """
    from autofuse.schedule import static_buffers

    lib = ex.mod.imports[0] if ex.mod.imports else ex.mod
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for name in dict.fromkeys(names):
        prim = compiled[name] if name in compiled else None
        if not isinstance(prim, tvm.tirx.PrimFunc) or not static_buffers(prim) or not lib.implements_function(name):
            continue
        timer = lib.time_evaluator(
            name, dev, number=config.number, repeat=max(3, config.repeat // 2),
            min_repeat_ms=config.min_repeat_ms,
        )
        out[name] = float(np.median(timer(*kernel_args(prim, dev, rng)).results))
    return out


def _build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params: Any) -> tvm.runtime.Module:
    """MetaSchedule's default_build without its `import tvm.s_tir.tensor_intrin`: that import
    parses every target's tensor intrinsics (14 s here) in each builder process, and LocalBuilder
    starts new processes for every batch of candidates (a 2-trial tuning of 3 tiny kernels: 100 s,
    most of it those imports). A CPU candidate needs none of them to build: tensorisation
    inlined the intrinsics' bodies while scheduling, and only the CUDA ones register functions
    that lowering looks up."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _candidate_builder(target: tvm.target.Target) -> Any:
    from tvm.s_tir import meta_schedule as ms

    cpu = target.kind.name == "llvm" and "riscv" not in str(target)  # RISC-V registers one too
    return ms.builder.LocalBuilder(f_build=_build_candidate) if cpu else "local"


def tune_kernels(
    fused: tvm.IRModule, target: tvm.target.Target, work_dir: str, trials_per_kernel: int, seed: int = 0
) -> int:
    """MetaSchedule-tune the kernels of a fused module that the database in `work_dir` does not
    know yet; returns how many were tuned. Records are keyed by the kernel's structural hash, so
    kernels shared by several plans or models are tuned once."""
    from tvm.s_tir import meta_schedule as ms

    from autofuse.schedule import split_unit_reductions_in

    tasks = ms.relax_integration.extract_tasks(split_unit_reductions_in(fused), target)  # as `schedule` sees them
    os.makedirs(work_dir, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=work_dir)
    new = [t for t in tasks if db.query_tuning_record(t.dispatched[0], target, t.task_name) is None]
    if not new:
        return 0
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        extracted_tasks=new, work_dir=work_dir, seed=seed
    )
    ms.tune_tasks(
        tasks=contexts,
        task_weights=weights,
        work_dir=work_dir,
        builder=_candidate_builder(target),
        max_trials_global=trials_per_kernel * len(new),
        max_trials_per_task=trials_per_kernel,
        num_trials_per_iter=min(64, trials_per_kernel),
        database=db,
    )
    return len(new)
