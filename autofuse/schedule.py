"""Cheap CPU schedules for fused kernels, so that fusion is judged on scheduled code.

TVM's default CPU pipeline runs every kernel as a serial, unvectorised loop nest; ranking fusion
plans on such code measures the wrong thing. This rule-based schedule is what a compiler
engineer would write first, and costs milliseconds per kernel:

- inline every elementwise/injective block into its consumer (or producer) where TIR allows;
- spatial blocks: fuse all loops, split off a vector-width inner loop, parallel outer, vectorised
  inner;
- reduction blocks: parallel over the outer spatial loops; for matmul/conv-like blocks (two or
  more spatial loops) the innermost spatial loop moves inside the reduction and is vectorised
  (the i-k-j order of a CPU GEMM), with the reduction's init split off;
- epilogue blocks that stay separate are computed inside the producer's parallel loop, so the
  fused intermediate stays in cache.

MetaSchedule (scheduler 'metaschedule') tunes kernels properly; its database is applied first
and this rule only schedules what the database does not know.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir
from tvm import tirx

SCHEDULED_ATTR = "tirx.is_scheduled"


def _vector_lanes(func: tirx.PrimFunc) -> int:
    bits = 32
    for buf in func.params:
        dtype = getattr(buf, "dtype", None)
        if dtype is not None and str(dtype).startswith("float"):
            bits = max(16, min(bits, tvm.DataType(str(dtype)).bits))
    return max(2, 256 // bits)  # AVX2 width; LLVM legalises for the actual CPU


def _extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _schedule_spatial(sch: s_tir.Schedule, loops: list, lanes: int) -> s_tir.schedule.LoopRV | None:
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    ext = _extent(sch, fused)
    if ext is not None and ext >= 2 * lanes and ext % lanes == 0:
        outer, inner = sch.split(fused, [None, lanes])
        sch.parallel(outer)
        sch.vectorize(inner)
        return outer
    if ext is None or ext > 1:
        sch.parallel(fused)
    return fused


def _schedule_reduction(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, s_loops: list, r_loops: list, lanes: int
) -> s_tir.schedule.LoopRV | None:
    inner = s_loops[-1] if len(s_loops) >= 2 else None
    inner_ext = _extent(sch, inner) if inner is not None else None
    vectorise = inner is not None and inner_ext is not None and inner_ext % lanes == 0
    outer = s_loops[:-1] if vectorise else s_loops
    sch.reorder(*outer, *r_loops, *([inner] if vectorise else []))
    par = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    if par is not None and (_extent(sch, par) or 2) > 1:
        sch.parallel(par)
    if vectorise:
        vi = sch.get_loops(block)[-1]
        if inner_ext and inner_ext > lanes:
            _, vi = sch.split(vi, [None, lanes])
        sch.vectorize(vi)
    # the init leaves the reduction loop; vectorising needs the reduction block intact first
    sch.decompose_reduction(block, r_loops[0])
    return par


def schedule_cpu(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """A scheduled copy of `func`, or None if the rule does not apply (left as it is)."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline

    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    infos = try_inline(sch, infos)
    lanes = _vector_lanes(func)
    anchors: dict[str, s_tir.schedule.LoopRV] = {}
    for info in infos:
        block = info.block_rv
        kinds = info.dom_kind()
        loops = sch.get_loops(block)
        if "O" in kinds or not loops or len(kinds) != len(loops):
            continue
        s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
        r_loops = [lp for lp, k in zip(loops, kinds) if k == "R"]
        if not s_loops:
            continue
        if not r_loops:
            if _attach_epilogue(sch, block, anchors):
                continue
            _schedule_spatial(sch, s_loops, lanes)
        else:
            par = _schedule_reduction(sch, block, s_loops, r_loops, lanes)
            if par is not None:  # decompose_reduction renamed the block
                anchors[info.name] = anchors[f"{info.name}_update"] = par
    return sch.mod["main"].with_attr(SCHEDULED_ATTR, True)


def _attach_epilogue(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, anchors: dict[str, s_tir.schedule.LoopRV]
) -> bool:
    # an elementwise consumer of a scheduled reduction: compute it per outer iteration of the
    # reduction, while that slice of the intermediate is still in cache
    for producer in sch.get_producers(block):
        name = sch.get(producer).name_hint
        if name in anchors:
            try:
                sch.reverse_compute_at(block, anchors[name])
                return True
            except (tvm.error.TVMError, s_tir.ScheduleError):
                return False
    return False


@tvm.transform.module_pass(opt_level=0, name="AutofuseScheduleCPU")
class ScheduleCPU:
    """Schedule every PrimFunc not yet scheduled (after FuseTIR, before lowering to the VM)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or SCHEDULED_ATTR in (func.attrs or {}):
                continue
            try:
                scheduled = schedule_cpu(func)
            except Exception:  # a kernel the rule cannot handle stays as it is: correct, slow
                scheduled = None
            if scheduled is not None:
                updates[gv] = scheduled
        if not updates:
            return mod
        out = mod.clone()  # a pass must not change its input
        for gv, func in updates.items():
            out[gv] = func
        return out


def flop_count(func: tirx.PrimFunc) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:
        return math.nan
