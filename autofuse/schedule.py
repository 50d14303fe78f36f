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
import re

import tvm
from tvm import s_tir
from tvm import tirx

SCHEDULED_ATTR = "tirx.is_scheduled"
# what TIR raises when it refuses a transformation (ScheduleError and InternalError are both
# RuntimeErrors in TVM 0.27)
_REFUSED = (RuntimeError, ValueError)
# loop-nest iterations below which a parallel loop costs more (thread wake-up, ~5-10 us) than
# it saves
MIN_PARALLEL_WORK = 1 << 15


def _vector_lanes(func: tirx.PrimFunc, vector_bits: int = 256) -> int:
    bits = 32
    for buf in func.params:
        dtype = getattr(buf, "dtype", None)
        if dtype is not None and str(dtype).startswith("float"):
            bits = max(16, min(bits, tvm.DataType(str(dtype)).bits))
    return max(2, vector_bits // bits)


def vector_bits(target: tvm.target.Target) -> int:
    """SIMD register width of an LLVM target's CPU (512 with AVX-512, 256 with AVX2, else 128)."""
    from tvm.target import codegen

    for feature, bits in (("avx512f", 512), ("avx2", 256)):
        try:
            if codegen.llvm_cpu_has_features([feature], target):
                return bits
        except Exception:  # unknown to this LLVM: assume the narrower width
            continue
    return 128


def _extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _work(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> int:
    return math.prod(_extent(sch, lp) or MIN_PARALLEL_WORK for lp in sch.get_loops(block))


def _schedule_spatial(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list, lanes: int
) -> s_tir.schedule.LoopRV | None:
    parallel = _work(sch, block) >= MIN_PARALLEL_WORK
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    ext = _extent(sch, fused)
    if ext is not None and ext >= 2 * lanes and ext % lanes == 0:
        outer, inner = sch.split(fused, [None, lanes])
        if parallel:
            sch.parallel(outer)
        sch.vectorize(inner)
        return outer
    if parallel:
        sch.parallel(fused)
    return fused


def _schedule_reduction(
    sch: s_tir.Schedule,
    block: s_tir.schedule.SBlockRV,
    s_loops: list,
    r_loops: list,
    lanes: int,
    tile: bool,
    s_vars: list[str],
) -> s_tir.schedule.LoopRV | None:
    if tile and len(s_loops) >= 2:
        par = _gemm_tiles(sch, block, s_loops, r_loops, lanes, _row_loop(sch, block, s_vars))
        if par is not None:
            return par
    parallel = _work(sch, block) >= MIN_PARALLEL_WORK
    inner = s_loops[-1] if len(s_loops) >= 2 else None
    inner_ext = _extent(sch, inner) if inner is not None else None
    vectorise = inner is not None and inner_ext is not None and inner_ext % lanes == 0
    outer = s_loops[:-1] if vectorise else s_loops
    sch.reorder(*outer, *r_loops, *([inner] if vectorise else []))
    par = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    if parallel and par is not None and (_extent(sch, par) or 2) > 1:
        sch.parallel(par)
    if vectorise:
        vi = sch.get_loops(block)[-1]
        if inner_ext and inner_ext > lanes:
            _, vi = sch.split(vi, [None, lanes])
        sch.vectorize(vi)
    # the init leaves the reduction loop; vectorising needs the reduction block intact first
    sch.decompose_reduction(block, r_loops[0])
    return par


def _row_loop(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, s_vars: list[str]) -> int:
    """Which spatial loop indexes the accumulator's rows: the innermost one (besides the
    vectorised last) whose variable is absent from every input the last one reads, so each
    vector load is reused by all rows (matmul: i against B[k, j]; conv: the output channel, not
    the image row, against the input window)."""
    reads = [str(r) for r in sch.get(block).reads]

    def uses(var: str, text: str) -> bool:
        return re.search(rf"\b{re.escape(var)}\b", text) is not None

    j_inputs = [r for r in reads if uses(s_vars[-1], r)]
    for k in reversed(range(len(s_vars) - 1)):
        if not any(uses(s_vars[k], r) for r in j_inputs):
            return k
    return len(s_vars) - 2


def _gemm_tiles(
    sch: s_tir.Schedule,
    block: s_tir.schedule.SBlockRV,
    s_loops: list,
    r_loops: list,
    lanes: int,
    row: int,
) -> s_tir.schedule.LoopRV | None:
    """Register tiles for matmul/conv-like blocks: a (rows x 2*lanes) accumulator kept in a local
    buffer across the whole reduction, rows unrolled, columns vectorised; tiles in parallel."""
    i, j = s_loops[row], s_loops[-1]
    others = [lp for k, lp in enumerate(s_loops[:-1]) if k != row]
    ext_i, ext_j = _extent(sch, i), _extent(sch, j)
    if ext_j is not None and ext_j % lanes and others and row != len(s_loops) - 2:
        # small images (4x4, 8x8 feature maps): vectorise over the fused image rows and columns
        j = sch.fuse(others.pop(), j)
        ext_j = _extent(sch, j)
    if ext_i is None or ext_j is None or ext_j % lanes:
        return None
    tj = 2 * lanes if ext_j % (2 * lanes) == 0 else lanes
    ti = next((t for t in (8, 4, 2) if ext_i % t == 0), 1)
    io, ii = sch.split(i, [None, ti])
    jo, ji = sch.split(j, [None, tj])
    sch.reorder(*others, io, jo, *r_loops, ii, ji)
    parallel = _work(sch, block) >= MIN_PARALLEL_WORK
    par = sch.fuse(*others, io, jo)
    if parallel:
        sch.parallel(par)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, par)
    sch.unroll(ii)
    jio, jii = sch.split(ji, [None, lanes])
    sch.unroll(jio)
    sch.vectorize(jii)
    sch.decompose_reduction(block, r_loops[0])
    sch.vectorize(sch.get_loops(acc)[-1])
    return par


def schedule_cpu(func: tirx.PrimFunc, lanes: int | None = None) -> tirx.PrimFunc | None:
    """A scheduled copy of `func`, or None if the rule does not apply (left as it is).

    `lanes`: float32 vector width of the target CPU (16 with AVX-512, 8 with AVX2).
    """
    for tile in (True, False):  # register tiling first; the plain schedule if tiling fails
        try:
            scheduled = _schedule(func, lanes or _vector_lanes(func), tile)
        except _REFUSED:
            continue
        if scheduled is not None:
            return scheduled
    return _parallel_outer(func)


def _parallel_outer(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    # kernels the block analysis cannot normalise (several reductions over different axes, as in
    # layer-norm or softmax): run each top-level loop nest's outer loop in parallel, where TIR
    # proves it legal
    sch = s_tir.Schedule(func)
    changed = False
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        extents = [_extent(sch, lp) or 0 for lp in loops]
        # the shortest prefix of loops with some parallel work (unit batch loops skipped)
        n = next((k for k in range(1, len(loops) + 1) if math.prod(extents[:k]) >= 2), 0)
        if not n or math.prod(extents) < MIN_PARALLEL_WORK:
            continue
        try:
            sch.parallel(sch.fuse(*loops[:n]) if n > 1 else loops[0])
            changed = True
        except _REFUSED:
            continue
    return sch.mod["main"].with_attr(SCHEDULED_ATTR, True) if changed else None


def _schedule(func: tirx.PrimFunc, lanes: int, tile: bool) -> tirx.PrimFunc | None:
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline

    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    # padding stays a block of its own: inlined, its bounds test sits in the innermost loop of
    # the convolution and defeats vectorisation; materialised, it is one cheap copy
    pads = [i for i in infos if i.name.startswith("pad")]
    infos = pads + try_inline(sch, [i for i in infos if not i.name.startswith("pad")])
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
            _schedule_spatial(sch, block, s_loops, lanes)
        else:
            s_vars = [str(it.var) for it, k in zip(info.iters, kinds) if k == "S"]
            par = _schedule_reduction(sch, block, s_loops, r_loops, lanes, tile, s_vars)
            if par is not None:  # decompose_reduction and cache_write rename what consumers read
                for producer in [info.name, f"{info.name}_update", f"{info.name}_local"]:
                    anchors[producer] = par
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
            except _REFUSED:
                return False
    return False


@tvm.transform.module_pass(opt_level=0, name="AutofuseScheduleCPU")
class ScheduleCPU:
    """Schedule every PrimFunc not yet scheduled (after FuseTIR, before lowering to the VM).

    Args:
        vector_bits: the target CPU's SIMD width (see `vector_bits`).
    """

    def __init__(self, vector_bits: int = 256) -> None:
        self.vector_bits = vector_bits

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or SCHEDULED_ATTR in (func.attrs or {}):
                continue
            try:
                scheduled = schedule_cpu(func, _vector_lanes(func, self.vector_bits))
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

