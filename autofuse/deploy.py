"""Deployment builds from cached plans: plan lookup, a TVM pass, build and export.

`AutofuseFusion` replaces the FuseOps -> FuseTIR pair inside anyone's Relax pipeline: place it
after LegalizeOps/AnnotateTIROpPattern (it normalises the module itself) and drop FuseOps and
FuseTIR. `build` and `export_library` do the whole job for a model or an IRModule.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import tvm

from autofuse import apply
from autofuse import build as builder
from autofuse import tvm_bridge
from autofuse.importer import ModelError
from autofuse.importer import module_inputs
from autofuse.plan import FusionPlan
from autofuse.plan import IllegalPlanError
from autofuse.plan import validate
from autofuse.tuning_log import LogError
from autofuse.tuning_log import TuningLog
from autofuse.workload import Workload
from autofuse.workload import workload_key


class PlanNotFound(ValueError):
    """No usable cached plan (only raised in strict mode, or for a log of other models).

    Raised inside AutofuseFusion, it reaches the caller through TVM's FFI as a RuntimeError
    carrying the same message.
    """


MS_DATABASE = "metaschedule"  # MetaSchedule work dir inside a log directory


@dataclass(frozen=True)
class ChosenPlan:
    plan: FusionPlan
    source: str  # "log" or "fallback"
    note: str
    latency_s: float | None = None
    scheduler: str | None = None  # the scheduler the plan was measured with (None: default)


def choose_plan(
    graph_key: str,
    graph: object,
    default: FusionPlan,
    log_dir: str | Path,
    target: str,
    strict: bool = False,
    model_name: str = "the model",
) -> ChosenPlan:
    """The cached best plan for (model key, target), or TVM's default with a note.

    Raises PlanNotFound when the log holds records but none for this model (or none for this
    target): the log was written for something else. With `strict`, a missing plan raises too.
    """
    log = TuningLog(log_dir)
    records = log.records()
    mine = [r for r in records if r.model_key == graph_key]
    if records and not mine:
        others = sorted({f"{r.model_name} ({r.model_key})" for r in records})
        raise PlanNotFound(
            f"{log.path} holds plans for {', '.join(others[:3])}, none for {model_name} ({graph_key})"
        )
    if mine and not [r for r in mine if r.target == target]:
        targets = sorted({r.target for r in mine})
        raise PlanNotFound(f"{log.path} holds plans for {model_name} on {targets}, not on {target}")
    best = log.best(graph_key, target)
    if best is not None:
        plan = FusionPlan.from_dict(best.plan)
        try:
            validate(graph, plan)  # type: ignore[arg-type]
        except IllegalPlanError as err:
            raise LogError(f"{log.path}: cached plan {plan.key} does not fit this model: {err}") from None
        note = f"cached plan {plan.key} ({best.role}, {best.scheduler} schedules)"
        tuned = best.protocol.get("threads")
        if tuned and os.environ.get("TVM_NUM_THREADS") != str(tuned):
            note += f"; tuned on {tuned} threads: run it with TVM_NUM_THREADS={tuned}, or tune where it runs"
        return ChosenPlan(plan, "log", note, best.median_s, best.scheduler)
    msg = f"no valid tuned plan for {model_name} on {target} in {log.path}"
    if strict:
        raise PlanNotFound(msg)
    warnings.warn(f"{msg}; using TVM's default fusion", stacklevel=2)
    return ChosenPlan(default, "fallback", msg + "; using TVM's default fusion")


def fused_module(w: Workload, target: str, log_dir: str | Path, strict: bool = False) -> tuple[tvm.IRModule, ChosenPlan]:
    chosen = choose_plan(w.key, w.graph, w.tvm_default(), log_dir, target, strict, w.name)
    return apply.apply_plan(w.mod, w.graph, chosen.plan), chosen


def build(w: Workload, target: str, log_dir: str | Path, strict: bool = False) -> tuple[tvm.runtime.Executable, ChosenPlan]:
    """Compile a workload with its cached best plan (TVM's default plan if none)."""
    fused, chosen = fused_module(w, target, log_dir, strict)
    database = str(Path(log_dir) / MS_DATABASE)
    return builder.build(fused, builder.make_target(target), chosen.scheduler, database), chosen


def export_library(w: Workload, target: str, log_dir: str | Path, out: str | Path, strict: bool = False) -> ChosenPlan:
    """Build and export a deployable library: load it with tvm.runtime.load_module and run it
    with the Relax VM (or the runtime-only VM entry points)."""
    ex, chosen = build(w, target, log_dir, strict)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    ex.export_library(str(out))
    return chosen


@tvm.transform.module_pass(opt_level=0, name="AutofuseFusion")
class AutofuseFusion:
    """Apply the cached fusion plan in place of FuseOps + FuseTIR.

    Kernels are left unscheduled, as FuseTIR leaves them: schedule them in your pipeline as you
    would after FuseTIR (or use `build`, which applies the scheduler the plan was tuned with).

    Args:
        log_dir: tuning log directory.
        target: target spec the plan was tuned for ('llvm', 'cuda:sm_90', ...).
        strict: raise instead of falling back to FuseOps when no plan is cached.
    """

    def __init__(self, log_dir: str | Path, target: str, strict: bool = False) -> None:
        self.log_dir, self.target, self.strict = Path(log_dir), target, strict
        self.chosen: ChosenPlan | None = None

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = tvm_bridge.normalize(mod)
        graph = tvm_bridge.extract_graph(mod)
        try:
            inputs = module_inputs(mod, ())
        except ModelError as err:
            raise PlanNotFound(str(err)) from None
        key = workload_key(mod, inputs)
        default = tvm_bridge.fuseops_plan(mod, graph)
        try:
            self.chosen = choose_plan(key, graph, default, self.log_dir, self.target, self.strict)
        except PlanNotFound as err:
            if self.strict:
                raise
            warnings.warn(f"{err}; using TVM's default fusion", stacklevel=2)
            self.chosen = ChosenPlan(default, "fallback", str(err))
        return apply.apply_plan(mod, graph, self.chosen.plan)
