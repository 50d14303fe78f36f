"""The measurement worker: runs in its own process, builds and times plans for one workload.

TVM can abort the whole process on an internal error, so nothing that compiles or runs a plan
happens in the tuning process. The worker reports the stage it enters before each step; when
it dies, the parent knows whether the build or the run killed it.

Protocol over a multiprocessing Connection: the parent sends a request dict; the worker answers
("stage", name) messages, then ("result", dict).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

# the environment variable carrying the id of the process that started the worker
PARENT_ENV = "AUTOFUSE_WORKER_PARENT"


def tolerance(dtype: str, compute: str | None = None) -> tuple[float, float]:
    """(rtol, atol) for comparing a fused plan's output with the unfused reference. `compute`:
    the least precise float type the model computes in (`compute_dtype`), whose rounding a
    float output carries: a float16 model with float32 inputs and outputs (onnxconverter's
    keep_io_types) differed by 3.9e-3 between two schedules of its unfused plan, and every plan
    was rejected at float32's tolerance."""
    if dtype in ("float16", "bfloat16") or (dtype.startswith("float") and compute in ("float16", "bfloat16")):
        return 1e-2, 1e-3
    if dtype.startswith("float"):
        return 1e-4, 1e-5
    return 0.0, 0.0


def compute_dtype(dtypes: Iterable[str]) -> str | None:
    """The least precise float type among the model's operators' results, or None."""
    bits = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}
    floats = [d for d in set(dtypes) if d in bits]
    return min(floats, key=lambda d: bits[d]) if floats else None


def compare(got: list[np.ndarray], want: list[np.ndarray], compute: str | None = None) -> tuple[bool, float]:
    """(whether `got` matches `want`, the largest absolute difference). Each element within rtol
    of itself or of its output's largest finite magnitude, plus atol: a small output of a
    normalised network carries the rounding of the large sums it came from (BiT's
    weight-standardised convolutions: 1.8e-5 on outputs up to 4.9, which rejected every plan,
    the unfused one included, against TVM's plain loop nests), while a miscompiled kernel is off
    by a fair part of the output's scale. `compute`: see `tolerance`."""
    if len(got) != len(want):
        return False, float("inf")
    ok, worst = True, 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False, float("inf")
        rtol, atol = tolerance(str(w.dtype), compute)
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        largest = float(diff.max()) if diff.size else 0.0
        if largest > worst or np.isnan(largest):  # a NaN difference is reported, and stays
            worst = largest
        ok = ok and bool(np.allclose(g, w, rtol=rtol, atol=max(atol, rtol * _magnitude(w)), equal_nan=True))
    return ok, worst


def _magnitude(a: np.ndarray) -> float:
    finite = np.abs(a[np.isfinite(a)]) if a.dtype.kind == "f" else np.abs(a)
    return float(finite.max()) if finite.size else 0.0


# Workloads with this many bytes of weights or more are compiled in every decision round rather
# than exported once and loaded: a library holds the weights. ResNet-50 (94 MB of weights):
# compiled in 1.9 s, exported in 2.5 s to 94 MB, loaded in 0.17 s; BERT-base (435 MB): compiled
# in 1.3 s, exported in 9 s to 435 MB, loaded in 0.7 s, four finalists 1.7 GB of disk
KEEP_LIBRARIES_BELOW = 256 << 20


class _Session:
    def __init__(self, mod: Any, inputs: list[dict[str, Any]], work_dir: str | None = None) -> None:
        from autofuse import tvm_bridge
        from autofuse.importer import InputSpec
        from autofuse.importer import random_inputs
        from autofuse.workload import weights_bytes

        self.mod = mod
        self.graph = tvm_bridge.extract_graph(self.mod)
        self.specs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in inputs]
        self.feeds = random_inputs(self.specs, seed=0)
        self.compute = compute_dtype(n.dtype for n in self.graph.nodes)
        self.reference: dict[str, list[np.ndarray]] = {}
        self.work_dir = work_dir  # shared by the workload's workers: reference outputs, libraries
        self.keeps_libraries = work_dir is not None and weights_bytes(work_dir) < KEEP_LIBRARIES_BELOW
        self.paired: dict[str, Any] = {}  # paired_executable's cache
        self.fastest_paired_s: dict[int, float] = {}  # each paired plan's fastest median in this worker

    def compile(
        self, groups: list[list[int]], target_spec: str, scheduler: str | None = None, database: str | None = None
    ) -> tuple[Any, Any, Any, Any, list[str]]:
        """Returns (executable, target, fused module, its kernels as compiled, kernel name per
        group)."""
        from autofuse import apply
        from autofuse import build
        from autofuse.plan import FusionPlan

        target = build.make_target(target_spec)
        plan = FusionPlan.from_groups(groups)
        # legality was checked by the parent under the user's limits; here only build it
        fused, kernels = apply.fuse(self.mod, self.graph, plan)
        scheduled = build.schedule(fused, target, scheduler or build.default_scheduler(target), database)
        ex, compiled = build.compile_repairing(fused, scheduled, target)
        return ex, target, fused, compiled, kernels

    def ref_outputs(self, target_spec: str) -> list[np.ndarray]:
        from autofuse import build

        if target_spec in self.reference:
            return self.reference[target_spec]
        # computed once per workload, not once per worker: every decision round starts a fresh
        # worker (BERT: 1.2 s of a 5 s round; BERT-base 27 s, ResNet-50 12 s)
        saved = None
        if self.work_dir is not None:
            digest = hashlib.sha1(target_spec.encode()).hexdigest()[:12]
            saved = os.path.join(self.work_dir, f"reference-{digest}.npz")
        if saved is not None and os.path.exists(saved):
            with np.load(saved) as npz:
                self.reference[target_spec] = [npz[f"out{k}"] for k in range(len(npz.files))]
            return self.reference[target_spec]
        # the reference is the unfused model with TVM's plain loop nests: no schedule to trust
        ex, target, _, _, _ = self.compile([[n] for n in range(len(self.graph))], target_spec, "none")
        self.reference[target_spec] = build.run(ex, build.device_for(target), self.feeds)
        # numpy's own types only: an .npz turns ml_dtypes' bfloat16 into raw bytes ('V2')
        if saved is not None and all(y.dtype.isbuiltin == 1 for y in self.reference[target_spec]):
            arrays = {f"out{k}": y for k, y in enumerate(self.reference[target_spec])}
            _write_whole(saved, lambda part: np.savez(part, **arrays), ".npz")
        return self.reference[target_spec]

    def library_path(self, req: dict[str, Any]) -> str | None:
        """Where the plan of `req` is kept for the workload's later workers (`_keep_library`),
        keyed by everything its build depends on; None without a shared work dir or for a
        workload of large weights (KEEP_LIBRARIES_BELOW). Kept libraries are dropped when
        MetaSchedule tunes kernels (`_tune_kernels`): the database they were built from changed."""
        if not self.keeps_libraries:
            return None
        key = json.dumps([req["groups"], req["target"], req.get("scheduler"), req.get("database")])
        return os.path.join(self.work_dir, "plans", hashlib.sha1(key.encode()).hexdigest()[:16] + ".so")

    def time_paired(self, ex: Any, paired: Any, dev: Any, config: Any) -> tuple[list[float], list[float]]:
        """A plan's samples and those of the plan paired with it, taken in turns; timed once more
        when the paired plan ran decision.SLOW_SPELL times slower than its fastest in this
        worker (a slow spell of the host changes the plans' ranking, not only their speed), the
        take in which it ran faster kept."""
        from autofuse import build
        from autofuse.decision import in_slow_spell

        fastest = self.fastest_paired_s.get(id(paired), float("inf"))
        takes = []
        for _ in range(2):
            mine, ref = build.time_interleaved([ex, paired], dev, self.feeds, config)
            takes.append((float(np.median(ref)), mine, ref))
            if not in_slow_spell(takes[-1][0], fastest):
                break
        ref_s, mine, ref = min(takes, key=lambda t: t[0])
        self.fastest_paired_s[id(paired)] = min(fastest, ref_s)
        return mine, ref

    def paired_executable(self, req: dict[str, Any], conn: Connection) -> Any:
        """The plan to time beside this one (`paired_with`), compiled once per worker; None when
        none is asked for or it does not build (the seed that measures TVM's plan logs that
        failure, and plans are then timed alone). Its build is stage 'pair': the parent stops
        pairing if the worker dies there."""
        if not req.get("paired_with"):
            return None
        key = json.dumps([req["paired_with"], req["target"], req.get("scheduler"), req.get("database")])
        if key not in self.paired:
            conn.send(("stage", "pair"))
            try:
                self.paired[key] = self.compile(req["paired_with"], req["target"], req.get("scheduler"),
                                                req.get("database"))[0]
            except Exception:
                self.paired[key] = None
        return self.paired[key]


def handle(session: _Session, req: dict[str, Any], conn: Connection) -> dict[str, Any]:
    from autofuse import build

    if req.get("op") == "tune_kernels":
        return _tune_kernels(session, req, conn)
    if req.get("op") == "reference":
        return _write_reference(session, req)
    if req.get("op") == "together":
        return _measure_together(session, req, conn)
    out, built = _build_and_check(session, req, conn)
    if built is None:
        return out
    ex, dev, compiled, kernels, target = built
    config = build.MeasureConfig(**req["config"])
    try:
        paired = session.paired_executable(req, conn)
        if paired is not None:
            conn.send(("stage", "run"))
            out["latencies_s"], out["default_latencies_s"] = session.time_paired(ex, paired, dev, config)
        else:
            out["latencies_s"] = build.time_latency(ex, dev, session.feeds, config)
    except Exception as err:
        out.update(status="runtime_error", error=_short(err))
        return out
    if req.get("time_groups"):
        out["kernel_latencies_s"] = _time_new_kernels(ex, compiled, kernels, out["kernels"], dev, req)
    return out


def _build_and_check(
    session: _Session, req: dict[str, Any], conn: Connection, keep: bool = False
) -> tuple[dict[str, Any], Any]:
    """Build one plan and check its outputs against the unfused model. Returns (result, None)
    when there is nothing to time (a failure, a build-only target, an export), else (result,
    (executable, device, its kernels as compiled, kernel names, target)). With `keep`, the
    library is exported for the workload's later workers and the exported one is timed (see
    `_kept_library`; kernels as compiled and their names are then None)."""
    from autofuse import build
    from autofuse.schedule import static_buffers

    conn.send(("stage", "build"))
    t0 = time.perf_counter()
    path = session.library_path(req) if keep else None
    kept = _kept_library(path, req, t0) if path else None
    if kept is not None:
        out, ex, target = kept
        compiled = kernels = None
    else:
        try:
            ex, target, fused, compiled, kernels = session.compile(
                req["groups"], req["target"], req.get("scheduler"), req.get("database")
            )
        except Exception as err:
            return {"status": "build_error", "error": _short(err)}, None
        out = {"status": "ok", "compile_s": time.perf_counter() - t0}
        out["kernels"] = [build.kernel_hash(fused, k) for k in kernels]
        if target.kind.name == "cuda":
            over = _gpu_resources(ex, target, kernels, out, req.get("resource_limits"))
            if over:
                out.update(status="over_limit", rule="resources", error="; ".join(over[:3]))
                return out, None
        if path:
            try:
                ex = _keep_library(ex, path, out)
            except Exception:  # no linker here, a full disk: timed as built, nothing kept
                pass
    if req.get("export_to"):  # a batch for another machine: the library and its kernels' buffers
        ex.export_library(req["export_to"])
        out["kernel_params"] = {  # what the runner times each kernel alone on
            h: [[[int(d) for d in b.shape], str(b.dtype)] for b in compiled[n].params]
            for n, h in zip(kernels, out["kernels"]) if static_buffers(compiled[n])
        }
        out["kernel_names"] = dict(zip(out["kernels"], kernels))
    if req.get("build_only") or req.get("export_to"):
        out["status"] = "built"
        return out, None
    conn.send(("stage", "run"))
    dev = build.device_for(target)
    try:
        want = session.ref_outputs(req["target"])
        got = build.run(ex, dev, session.feeds)
        ok, worst = compare(got, want, session.compute)
        out["max_abs_err"] = worst
        if not ok:
            out.update(status="wrong_result", error=f"max abs diff {worst:.3g} vs unfused")
            return out, None
    except Exception as err:
        out.update(status="runtime_error", error=_short(err))
        return out, None
    return out, (ex, dev, compiled, kernels, target)


def _kept_library(path: str, req: dict[str, Any], t0: float) -> tuple[dict[str, Any], Any, Any] | None:
    """(build result, loaded library, target) of a plan an earlier worker of this workload built
    and kept at `path`, or None."""
    import tvm

    from autofuse import build

    if not os.path.exists(path + ".json"):
        return None
    try:
        with open(path + ".json") as fh:
            out = json.load(fh)
        lib = tvm.runtime.load_module(path)
    except Exception:  # unreadable: the plan is built again
        return None
    out["compile_s"] = time.perf_counter() - t0  # what this worker spent: loading it
    return out, lib, build.make_target(req["target"])


def _keep_library(ex: Any, path: str, out: dict[str, Any]) -> Any:
    """Export a plan's library to `path` for the workload's later workers, and return it loaded:
    the decision rounds build the same plans in a fresh worker each (BERT: 0.57 s to compile a
    plan, 0.3 s to export it once, 0.01 s to load), and every round, the first included, times
    the same machine code, the kind a deployment runs (`autofuse apply` exports a library).
    The build result is written last: a library is never read without it."""
    import tvm

    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_whole(path, ex.export_library, ".so")  # TVM picks the linker by the suffix
    _write_whole(path + ".json", lambda part: Path(part).write_text(json.dumps(out)))
    return tvm.runtime.load_module(path)


def _write_whole(path: str, write: Callable[[str], Any], suffix: str = "") -> None:
    """`write` a file of the workload's shared work dir under a name of this process's, then
    rename it to `path`: another worker never reads it half-written."""
    part = f"{path}.{os.getpid()}{suffix}"
    write(part)
    os.replace(part, path)


# seconds for one runtime's idle threads to stop competing for the cores before the other's
# samples: TVM's pool threads yield for 300,000 turns after a parallel kernel, onnxruntime's
# spin after a run; on two cores either slowed the other's parallel work (see _measure_together)
SETTLE_S = 0.3


def _measure_together(session: _Session, req: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """Build and check several plans, then time those that ran correctly in turns
    (build.time_interleaved): the k-th samples of all plans are neighbours in time. With
    `onnxruntime` (an ONNX file of the model), onnxruntime's samples are taken first, before any
    plan runs in this process (after warm-up samples: its first ones in a fresh worker ran up to
    1.4x slow in a one-off timing), and the plans' after a pause. Timed in turns with the plans, each runtime's
    waiting threads took a core from the other's next samples: the MLP's one-kernel plan ran
    1,642 us a call in turns with onnxruntime against 3.8 alone, onnxruntime's BERT 869 us 20 ms
    after TVM's plan against 299 alone (scripts/runtime_interference.py). Returns
    {"status": "ok", "results": one result per plan, in request order, "onnxruntime_latencies_s"
    or "onnxruntime_error"}."""
    from autofuse import build

    config = build.MeasureConfig(**req["config"])
    reply: dict[str, Any] = {"status": "ok"}
    if req.get("onnxruntime"):
        time.sleep(SETTLE_S)  # a worker that has run plans before
        try:
            sample = _onnxruntime_sampler(req["onnxruntime"], session, config)
            with build.no_garbage_collection():
                for _ in range(5):  # warm-up, not kept
                    sample()
                reply["onnxruntime_latencies_s"] = [sample() for _ in range(config.repeat)]
        except Exception as err:  # onnxruntime cannot run it: recorded, the plans are timed
            reply["onnxruntime_error"] = _short(err)
        time.sleep(SETTLE_S)
    results, timed = [], []
    for groups in req["plans"]:
        # decision rounds: the same plans, each round in a fresh worker
        out, built = _build_and_check(session, {**req, "groups": groups}, conn, keep=not req.get("time_groups"))
        results.append(out)
        if built is not None:
            timed.append((out, built))
    reply["results"] = results
    if timed:
        conn.send(("stage", "run"))
        try:
            executables, device = [ex for _, (ex, *_) in timed], timed[0][1][1]
            samples = build.time_interleaved(executables, device, session.feeds, config)
        except Exception as err:
            for out, _ in timed:
                out.update(status="runtime_error", error=_short(err))
            return reply
        for (out, (ex, dev, compiled, kernels, _)), lat in zip(timed, samples):
            out["latencies_s"] = lat
            if req.get("time_groups"):
                out["kernel_latencies_s"] = _time_new_kernels(ex, compiled, kernels, out["kernels"], dev, req)
    return reply


def _onnxruntime_sampler(path: str, session: _Session, config: Any) -> Any:
    from autofuse.baselines import onnxruntime_runner
    from autofuse.baselines import sampler

    run = onnxruntime_runner(path, session.specs, session.feeds)
    return sampler(run, config.min_repeat_ms / 1000)


def _time_new_kernels(
    ex: Any, compiled: Any, names: list[str], hashes: list[str], dev: Any, req: dict[str, Any]
) -> dict[str, float]:
    """Time the plan's kernels not yet known to the parent (keyed by the hash of the
    unscheduled kernel: the group's identity; the scheduler is recorded beside it)."""
    from autofuse import build

    known = set(req.get("known_kernels", ()))
    todo = {h: n for n, h in zip(names, hashes) if h not in known}
    if not todo:
        return {}
    cfg = build.MeasureConfig(number=3, repeat=5, min_repeat_ms=5)
    try:
        by_name = build.time_kernels(ex, compiled, list(todo.values()), dev, cfg)
    except Exception:  # kernel timing is only cost-model data; the plan itself measured fine
        return {}
    return {h: by_name[n] for h, n in todo.items() if n in by_name}  # static_buffers only


def _tune_kernels(session: _Session, req: dict[str, Any], conn: Connection) -> dict[str, Any]:
    from autofuse import apply
    from autofuse import build
    from autofuse.plan import FusionPlan

    conn.send(("stage", "build"))
    t0 = time.perf_counter()
    try:
        target = build.make_target(req["target"])
        plan = FusionPlan.from_groups(req["groups"])
        fused, _ = apply.fuse(session.mod, session.graph, plan)
        n = build.tune_kernels(fused, target, req["database"], req["trials"], req.get("seed", 0))
        if n and session.work_dir is not None:  # built from the database before these records
            shutil.rmtree(os.path.join(session.work_dir, "plans"), ignore_errors=True)
    except Exception as err:
        return {"status": "build_error", "error": _short(err)}
    return {"status": "ok", "tuned_kernels": n, "tuning_s": time.perf_counter() - t0}


def _write_reference(session: _Session, req: dict[str, Any]) -> dict[str, Any]:
    """Save the inputs and the unfused CPU reference outputs as .npy files in req["out_dir"]."""
    out_dir = req["out_dir"]
    want = session.ref_outputs("llvm")
    inputs, expected = [], []
    for spec, x in zip(session.specs, session.feeds):
        name = f"input_{len(inputs)}.npy"
        np.save(os.path.join(out_dir, name), x)
        inputs.append({"name": spec.name, "file": name, "shape": list(x.shape), "dtype": str(x.dtype)})
    for k, y in enumerate(want):
        expected.append(f"expected_{k}.npy")
        np.save(os.path.join(out_dir, expected[-1]), y)
    return {"status": "ok", "inputs": inputs, "expected": expected,
            "tolerance": list(tolerance(str(want[0].dtype) if want else "float32", session.compute))}


def _gpu_resources(
    ex: Any, target: Any, kernels: list[str], out: dict[str, Any], limits: dict[str, Any] | None
) -> list[str]:
    """Read registers/spills/shared memory of each group's CUDA kernels into out["resources"]
    (keyed by kernel hash); returns the groups over the limits. Without nvcc nothing is read
    and nothing is rejected."""
    from autofuse import gpu_resources as gr

    source = gr.cuda_source(ex.mod)
    if source is None:
        return []
    arch = str(target.attrs.get("arch", "sm_90"))
    try:
        usage = gr.by_function(gr.ptxas_usage(source, arch), kernels)
    except gr.ResourceError:
        return []
    rules = gr.ResourceLimits.from_dict(limits)
    out["resources"] = {}
    over: list[str] = []
    for name, key in zip(kernels, out["kernels"]):
        if name in usage:
            out["resources"][key] = usage[name].to_dict()
            over += rules.violations(name, usage[name], arch)
    return over


def _short(err: BaseException) -> str:
    # the last line says what failed, but not a TVMScript comment ("# Metadata omitted ...")
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    msg = lines[-1] if lines else type(err).__name__
    return f"{type(err).__name__}: {msg}"[:500]


def serve(conn: Connection, work_dir: str, inputs: list[dict[str, Any]]) -> None:
    """Load the workload (`Workload.save`d in work_dir) once, then answer requests until told to
    stop."""
    from autofuse.tvm_bridge import skip_schedule_type_checks
    from autofuse.workload import load_module

    skip_schedule_type_checks()
    session = _Session(load_module(work_dir), inputs, work_dir)
    conn.send(("ready", None))
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req is None:
            return
        try:
            result = handle(session, req, conn)
        except (BrokenPipeError, EOFError):  # the parent gave up on this request (timeout, exit)
            return
        except Exception as err:  # never let one plan take the worker down
            result = {"status": "runtime_error", "error": _short(err)}
        try:
            conn.send(("result", result))
        except (BrokenPipeError, EOFError, OSError):  # the parent stopped waiting: nothing to tell
            return


def die_with_parent(parent: int) -> None:
    """Have Linux kill this worker when the process that started it dies (PR_SET_PDEATHSIG):
    a tuning job ended by `timeout` or a signal otherwise left its worker timing plans on for
    minutes, sharing the CPU with whatever was measured next. `parent`: that process's id, to
    catch a parent that died before the request was made. Linux sends the signal when the
    thread that started the worker ends: a measurer used from a thread that ends loses its
    worker with it (and starts another when next asked). Elsewhere nothing is done."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


if __name__ == "__main__":
    import json

    # tvm_ffi imports torch when it is installed (for DLPack exchange, which the worker never
    # does): 2.1 s of the worker's 3.7 s start here, paid again by every decision round's fresh
    # worker. Marked absent, `import torch` raises ImportError, which tvm_ffi expects
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    die_with_parent(int(os.environ.get(PARENT_ENV, os.getppid())))
    serve(Connection(int(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3]))
