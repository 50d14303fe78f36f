"""Cheap CPU schedules for fused kernels, so that fusion is judged on scheduled code.

TVM's default CPU pipeline runs every kernel as a serial, unvectorised loop nest; ranking fusion
plans on such code measures the wrong thing. This rule-based schedule is what a compiler
engineer would write first, and costs milliseconds per kernel:

- inline every elementwise/injective block into its consumer (or producer) where TIR allows;
- spatial blocks: outer loops fused and parallel (when the nest is big enough to pay for the
  thread pool), the innermost axis vectorised where a vector width divides it;
- reduction blocks: parallel over the outer spatial loops; for matmul/conv-like blocks (two or
  more spatial loops) the innermost spatial loop moves inside the reduction and is vectorised
  (the i-k-j order of a CPU GEMM), with the reduction's init split off;
- epilogue blocks that stay separate are computed inside the producer's parallel loop, so the
  fused intermediate stays in cache;
- row kernels (reductions over the innermost axis and their broadcasts: softmax, layer norm and
  fused chains of them) run every stage one row at a time under one row loop, reductions
  vectorised over a vector of partial results. This is what makes reduction -> broadcast fusion
  pay on a CPU: the row stays in L1 from stage to stage.

MetaSchedule (scheduler 'metaschedule') tunes kernels properly; its database is applied first
and this rule only schedules what the database does not know.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir
from tvm import tirx
from tvm.sym import detect_linear_equation

SCHEDULED_ATTR = "tirx.is_scheduled"
# the parameters of a PrimFunc a schedule may re-lay (weights passed as constants; TVM's name),
# and those it did re-lay, as [parameter index, panel width] pairs (see _pack_weights)
LAYOUT_FREE_ATTR = "layout_free_buffers"
PACKED_ATTR = "autofuse.packed_weights"
# on a kernel each of whose constant weights the module passes at two calls or more (an unrolled
# recurrence's, at every step): they come from cache, not memory (see _reused)
REUSED_ATTR = "autofuse.reused_weights"
# what TIR raises when it refuses a transformation (ScheduleError and InternalError are both
# RuntimeErrors in TVM 0.27)
_REFUSED = (RuntimeError, ValueError)
_REDUCE = 2  # IterVar.iter_type of a reduction iterator (CommReduce)
# loop-nest iterations below which a parallel loop costs more than it saves: the thread pool's
# launch and join cost ~5-10 us, and a straggling thread (another process on a core) stalls
# the join. Swept on the benchmark models with 2 threads: 1<<15 left MobileNetV2 at 260 us,
# 1<<18 gives 219 us with ResNet, BERT and the transformer block unchanged.
MIN_PARALLEL_WORK = 1 << 18
# the same for row kernels, counted over all their stages: each row pass (an exp polynomial, a
# division, a reduction) costs more than an elementwise iteration. Swept on norm_chain (softmax +
# layer norm as primitives, 64 x 256): 1<<16 puts the fused 21-op kernel on both cores (29 us
# against 39 us for the FuseOps plan) and keeps the small unfused pieces serial; 1<<14 put them
# on both cores too and doubled their time.
ROW_PARALLEL_WORK = 1 << 16
# a stage whose output a block this many times larger reads broadcast is computed on its own,
# once, not inlined into that block (see _schedule)
BROADCAST_REUSE = 8
# the same, in elements, for an elementwise block that is costly per element (a division, exp,
# rounding: see _costly) or an epilogue left out of its tile: DynamicQuantizeLinear's
# quantization of a 16x64x192 activation (a division, a rounding, two casts per element)
# 177 -> 87 us on two cores
COSTLY_PARALLEL_WORK = 1 << 15
# a reduction of a whole tensor to one value runs in parallel chunks from this many elements
MIN_WHOLE_REDUCTION = 1 << 14
WHOLE_CHUNKS = 16
# the most characters of TIR a block's body may print in once a stage is inlined into it.
# Inlining copies a stage's expression into every place its consumer reads it; down a chain
# whose values are each read twice (RWKV's recurrence unrolled: the max of two running sums,
# exps of their differences) the copies double at every link. RWKV's all-fusions plan had six
# kernels of 1.6-1.9 MB of TIR, 8-11 s each to lower: the plan built in 92 s, with the bound in
# 17 s, the same latency (paired 1.01x); norm_chain's all-fusions kernel, whose fast_exp reads
# its input 18 times, 229 -> 46 KB of TIR and 638 -> 421 us alone. Such a stage stays a block
# of its own. No other kernel of the seed plans of the nine benchmark models and of ten unseen
# ones (T5, Swin, EfficientNet, Whisper, Mamba, Llama, MobileViT, DeBERTa, FNet, SegFormer)
# changes; their largest body prints in 13.5 KB (Mamba's).
MAX_INLINED_CHARS = 1 << 14


def _names(text: str, var: str) -> bool:
    """Whether printed TIR `text` mentions the variable named `var` (none for the unit row that
    `_schedule_reduction` adds to a one-row product, which has no variable)."""
    return bool(var) and re.search(rf"\b{re.escape(var)}\b", text) is not None


def _uses(expr: object, var: tirx.Var) -> bool:
    """Whether TIR expression `expr` depends on `var`."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


# the lines printed TIR starts with to declare the free variables and buffers of a statement
_DECLARATION = re.compile(r"^\w+ = T\.\w+\(.*$", re.M)


def only_indexes(text: str, var: str, places: dict[str, int]) -> bool:
    """Whether each mention of `var` in a printed TIR statement is a whole index of a buffer at
    the axis `places` names for it (`y[v_i0, v_i1]` with places {"y": 0} for var v_i0): the
    statement computes nothing from it."""
    body = _DECLARATION.sub("", text)
    for m in re.finditer(rf"\b{re.escape(var)}\b", body):
        before, after = body[:m.start()].rstrip(), body[m.end():].lstrip()
        if not before or before[-1] not in "[," or not after or after[0] not in ",]":
            return False
        depth, commas, k = 0, 0, m.start() - 1
        while k >= 0 and (depth or body[k] not in "(["):  # back to the bracket this index is in
            depth += {")": 1, "]": 1, "(": -1, "[": -1}.get(body[k], 0)
            commas += body[k] == "," and not depth
            k -= 1
        name = re.search(r"(\w+)$", body[:k]) if k >= 0 and body[k] == "[" else None
        if name is None or places.get(name.group(1)) != commas:
            return False
    return True


def vector_lanes(func: tirx.PrimFunc, vector_bits: int = 256) -> int:
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


def _vector_width(extent: int | None, lanes: int) -> int | None:
    """The widest vector (full, half or quarter register; at least 4 elements) that divides a
    loop of `extent`: 8 output channels still vectorise on an AVX-512 machine."""
    if extent is None:
        return None
    return next((w for w in (lanes, lanes // 2, lanes // 4) if w >= 4 and extent % w == 0), None)


def _extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _work(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> int:
    return math.prod(_extent(sch, lp) or MIN_PARALLEL_WORK for lp in sch.get_loops(block))


def _schedule_spatial(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list, lanes: int, costly: bool = False
) -> s_tir.schedule.LoopRV | None:
    """Outer loops fused and parallel, the innermost axis vectorised where a vector width divides
    it. Only the innermost axis: vector lanes spread over a fused index would compute div/mod per
    lane and gather (a 3-channel image row, a 34-wide padded row); such an inner loop stays
    serial for LLVM to handle. `costly`: parallel from COSTLY_PARALLEL_WORK elements."""
    concat = _concat_segments(sch, block, loops, lanes)
    if concat is not None:
        return _schedule_concat(sch, block, loops, *concat, lanes)
    loops = _unfold_flat_loop(sch, block, loops)
    gathered = _gathered_loop(sch, block, loops)
    width = _vector_width(_extent(sch, loops[-1]), lanes)
    if gathered is not None and width is None:
        # no vector divides the image row: the channels innermost, the coordinates computed once
        # per pixel (on an Intel host LRASPP's 21 x 64 x 64 output took 264 us in vectors along
        # whole rows, 51 us so)
        loops = [lp for k, lp in enumerate(loops) if k != gathered] + [loops[gathered]]
        sch.reorder(*loops)
        width, gathered = _vector_width(_extent(sch, loops[-1]), lanes), None
    across = _transposed_loop(sch, block, loops, lanes) if gathered is None else None
    tile = _transpose_tile(sch, block, _extent(sch, loops[across]) or 0, width, lanes) if across is not None else None
    across = across if tile else None
    # an element of a loop that does not vectorise (a transpose's strided reads) costs about a
    # vector's worth of work: ResNet-50's NHWC -> NCHW output, 100K elements, ran serial; so
    # does a vector gathered from `lanes` rows
    vector = width is not None and across is None and gathered is None
    parallel = (_work(sch, block) * (1 if vector else lanes) >= MIN_PARALLEL_WORK
                or costly and _work(sch, block) >= COSTLY_PARALLEL_WORK)
    if gathered is not None:
        # a resize into NCHW at a segmentation model's output, its input channels-last: a
        # vector of an image row computes its input coordinates, one per lane, once, then
        # gathers them for every channel in turn, each write a whole vector of a row. With the
        # channels innermost (above) a pixel's channels were written an image apart, element by
        # element; with them outside whole rows the coordinates were computed once per channel
        # (`scripts/schedule_ab.py`, AMD EPYC host: DeepLabV3-MobileNetV3's 21 x 224 x 224
        # output 990 -> 746 us, 757 -> 691 with cold caches; LRASPP's 21 x 64 x 64 96 -> 71 us)
        rest, inner = sch.split(loops[-1], [None, width])
        others = [lp for k, lp in enumerate(loops[:-1]) if k != gathered]
        sch.reorder(*others, rest, loops[gathered], inner)
        outer = sch.fuse(*others, rest)
        sch.vectorize(inner)
    elif across is not None:
        # a transpose in square tiles: a vector of the output gathers one element from each of
        # `lanes` input rows, and the next `lanes` vectors find the rest of those rows' cache
        # lines in L1 (BERT-base's 128 x 768 -> 12 x 64 x 128 key transpose: 103 -> 14 us).
        # Where no vector divides the output rows (1599 frames, 197 tokens) the tiles are
        # scalar, the last ones partial: still each cache line read once rather than once per
        # element of a row too long for L1 (1599 x 512 -> 512 x 1599: 1279 -> 367 us,
        # `scripts/ragged_shapes.py transpose`; ViT-B's key transpose over 197 tokens 85 -> 37 us,
        # `scripts/schedule_ab.py`). How many input rows a tile takes: _transpose_tile
        rest, inner = sch.split(loops[-1], [None, width or lanes])
        tiles, down = sch.split(loops[across], [None, tile])
        others = [lp for k, lp in enumerate(loops[:-1]) if k != across]
        sch.reorder(*others, tiles, rest, down, inner)
        outer = sch.fuse(*others, tiles, rest)
        if width is not None:
            sch.vectorize(inner)
    elif width is not None:  # it divides the extent
        rest, inner = sch.split(loops[-1], [None, width])
        outer = sch.fuse(*loops[:-1], rest) if loops[:-1] else rest
        sch.vectorize(inner)
    elif len(loops) > 1:
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    else:
        outer = loops[0]
    if parallel and (_extent(sch, outer) or 2) > 1:
        sch.parallel(outer)
    return outer


def _unfold_flat_loop(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list) -> list:
    """The block's loops after re-laying its innermost iterator as the input axes it stands for,
    where an input reads it through divisions and remainders that tile it exactly (a transpose
    written flat: PoolFormer's NHWC -> NCHW -> [1, 1, C * H * W] before its group norm reads
    x[0, (j % 3136) // 56, j % 56, j // 3136]): one iterator per axis, the transpose is seen and
    run in tiles (56 x 56 x 64: 250 -> 28 us). Otherwise `loops` unchanged."""
    from tvm import sym

    driven = _driven(sch, block, loops)
    if not driven or len(driven[-1]) != 1:
        return loops
    blk = sch.get(block)
    inner = blk.iter_vars[next(iter(driven[-1]))].var
    doms = {iv.var: iv.dom for iv in blk.iter_vars}
    for region in blk.reads:
        mins = [r.min for r in region.region]
        if not any(isinstance(m, (tirx.FloorDiv, tirx.FloorMod)) and _uses(m, inner) for m in mins):
            continue
        splits = sorted((sp for e in sym.detect_iter_map(mins, doms).indices for sp in _splits_of(e, inner)),
                        reverse=True)
        if len(splits) < 2 or splits[-1][0] != 1 or any(
                low != nxt_low * nxt_ext for (low, _), (nxt_low, nxt_ext) in zip(splits, splits[1:])):
            continue
        if math.prod(ext for _, ext in splits) != _extent(sch, loops[-1]):
            continue
        at = next(k for k, iv in enumerate(blk.iter_vars) if iv.var.same_as(inner))

        def unfold(*x):  # noqa: ANN202 - an index map
            pieces = [x[at] // low if k == 0 else x[at] // low % ext for k, (low, ext) in enumerate(splits)]
            return [*x[:at], *pieces, *x[at + 1:]]

        try:  # the block's own iterators re-laid: its reads then name each axis by one of them
            sch.transform_block_layout(block, tirx.IndexMap.from_func(
                unfold, ndim=len(blk.iter_vars), index_dtype=str(inner.ty.dtype)))
        except _REFUSED:
            return loops
        _simplify_indices(sch, block)
        return sch.get_loops(block)
    return loops


def _simplify_indices(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """Simplify `block`'s value and indices knowing its iterators' ranges, which
    transform_block_layout leaves as it substituted them ((c * 3136 + h * 56 + w) % 3136 // 56
    for h)."""
    from tvm.sym.analyzer import Analyzer

    blk = sch.get(block)
    store = blk.body
    if not isinstance(store, tirx.BufferStore):
        return
    ana = Analyzer()
    for iv in blk.iter_vars:
        ana.bind(iv.var, iv.dom)
    regions = [[tvm.ir.Range.from_min_extent(ana.simplify(r.min), r.extent) for r in region.region]
               for region in blk.reads]
    body = tirx.BufferStore(store.buffer, ana.simplify(store.value), [ana.simplify(i) for i in store.indices])
    _replace_body(sch, block, body, [tirx.BufferRegion(region.source, rs) for region, rs in zip(blk.reads, regions)])


def _splits_of(expr: object, var: tirx.Var) -> list[tuple[int, int]]:
    """(lower factor, extent) of each piece of `var` in an affine iterator map (detect_iter_map's
    IterSumExpr: v // 3136 is (3136, 64) of a 200704-long v; a piece of a piece composes)."""
    pieces = []
    for arg in expr.args:  # type: ignore[attr-defined]
        source = arg.source.source
        if not isinstance(arg.lower_factor, tirx.IntImm) or not isinstance(arg.extent, tirx.IntImm):
            continue  # a run-time size: left as it is
        if isinstance(source, tirx.Var):
            if source.same_as(var):
                pieces.append((int(arg.lower_factor), int(arg.extent)))
        elif len(getattr(source, "args", ())) == 1:
            pieces += [(low * int(arg.lower_factor), int(arg.extent)) for low, _ in _splits_of(source, var)]
    return pieces


def _concat_axis(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list) -> tuple[int, list[int]] | None:
    """(the loop, the lengths of the inputs it takes in turn) of a concatenation, when the block
    is one (its value a chain of if_then_else, its reads of two inputs or more offset along one
    axis by the start of each); None otherwise. The innermost axis first (channels-last feature
    maps), else the outermost one that is (an LSTM's steps, stacked along time)."""
    blk = sch.get(block)
    text = _body_text(blk.body)
    driven = _driven(sch, block, loops) if "if_then_else" in text else None  # the cheap test first
    if driven is None:
        return None
    for axis in [len(loops) - 1, *range(len(loops) - 1)]:
        extent = _extent(sch, loops[axis])
        if extent is None or len(driven[axis]) != 1:
            continue
        var = blk.iter_vars[next(iter(driven[axis]))].var
        outer = axis < len(loops) - 1
        starts, inputs = {0}, set()
        for region in blk.reads:  # along the innermost axis, offsets in the inputs' own last axis
            for rng in region.region if outer else region.region[-1:]:
                coefs = list(detect_linear_equation(rng.min, [var]))
                if len(coefs) == 2 and _is_one(coefs[0]) and isinstance(coefs[1], tirx.IntImm):
                    starts.add(-int(coefs[1].value))
                    inputs.add(region.source.name)
            if outer and _one_step(region, axis, len(loops)):
                inputs.add(region.source.name)
        if outer:  # a step read at index 0 has its start in the test that picks it (`15 <= v1`)
            name = re.escape(str(var.name))
            starts.update(int(c) for c in re.findall(rf"(?:T\.int\d+\()?(\d+)\)? <= {name}(?![\w.])", text))
        bounds = sorted(b for b in starts if 0 <= b < extent)
        # along an outer axis, reads of one input offset: a padding, not a concatenation
        if len(bounds) > 1 and (len(inputs) > 1 or not outer):
            return axis, [b - a for a, b in zip(bounds, [*bounds[1:], extent])]
    return None


def _one_step(region: object, axis: int, ndim: int) -> bool:
    """Whether a read is of an input one element long on the concatenated (outer) axis, read
    there at 0: a step of a stack whose offset TIR folded away once the op that made it was
    inlined (an LSTM's outputs, each picked from two steps by direction, then stacked)."""
    if len(region.region) != ndim:
        return False
    dim, rng = region.source.shape[axis], region.region[axis]
    return isinstance(dim, tirx.IntImm) and int(dim) == 1 and isinstance(rng.min, tirx.IntImm) and int(rng.min) == 0


# a concatenation along an outer axis of fewer inputs (a class token before the patch tokens,
# a rotary embedding's halves) keeps the schedule of a plain copy or transpose (tiles, threads):
# split per input, EVA-02's rotary kernel ran 30 -> 49 us, TNT's class-token one 9.6 -> 18.8 us;
# Sequencer2D's LSTMs stack 16 steps. Nor is a concatenation of fewer inputs kept out of a
# reader that reshapes or transposes it (_inline_fits)
OUTER_CONCAT_INPUTS = 3


def _concat_segments(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list, lanes: int
) -> tuple[int, list[int]] | None:
    """_concat_axis, where each input's run vectorises as the whole axis would: not an element
    shifted by one along the innermost axis (a padding or a roll along it)."""
    concat = _concat_axis(sch, block, loops)
    if concat is None:
        return None
    axis, segments = concat
    if axis < len(loops) - 1:  # see OUTER_CONCAT_INPUTS
        return concat if len(segments) >= OUTER_CONCAT_INPUTS else None
    if (_vector_width(math.gcd(*segments), lanes) is None
            and _vector_width(_extent(sch, loops[axis]), lanes) is not None):
        return None
    return concat


def _schedule_concat(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list, axis: int, segments: list[int], lanes: int
) -> s_tir.schedule.LoopRV | None:
    """A concatenation (with whatever elementwise ops were inlined into it) as one loop per input
    along the concatenated axis: in each, the chain of if_then_else that picks the input folds
    away and the loop vectorises. Inlined whole, every element tested all the boundaries:
    DenseNet's batch-norm-ReLU over the concatenation of 25 inputs, 4x4x1024, ran ~50 us."""
    work = _work(sch, block)  # the block is copied into each loop below, and then gone
    # the loops outside the axis run in parallel; those inside it (along an outer axis) as one,
    # which each input's copy vectorises
    outer = (sch.fuse(*loops[:axis]) if axis > 1 else loops[0]) if axis else None
    if axis + 2 < len(loops):
        sch.fuse(*loops[axis + 1:])
    # partitioned loops do not start at 0, which split refuses: partition whole runs of `step`
    step = math.gcd(*segments)
    runs, _ = sch.split(loops[axis], [None, step])
    for part in sch.loop_partition(runs, [n // step for n in segments[:-1]] + [None]):
        for copy in sch.get_child_blocks(part):  # its innermost loop: the run of `step`, or the inner axes
            last = sch.get_loops(copy)[-1]
            width = _vector_width(_extent(sch, last), lanes)
            if width is not None:
                sch.vectorize(sch.split(last, [None, width])[1])
    if outer is not None and work >= MIN_PARALLEL_WORK and (_extent(sch, outer) or 2) > 1:
        sch.parallel(outer)
    return outer


def _element_axes(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list
) -> tuple[object, dict[int, int], tirx.Var] | None:
    """(the block, iterator index -> loop index, the innermost loop's iterator) where each loop
    drives at most one iterator of `block` (a spatial nest as normalised); None otherwise."""
    driven = _driven(sch, block, loops)
    if driven is None or len(loops) < 2 or any(len(d) > 1 for d in driven):
        return None
    blk = sch.get(block)
    var_of = {next(iter(d)): k for k, d in enumerate(driven) if d}
    inner_iv = next((i for i, k in var_of.items() if k == len(loops) - 1), None)
    return None if inner_iv is None else (blk, var_of, blk.iter_vars[inner_iv].var)


def _unit_loop(blk: object, var_of: dict[int, int], index: object) -> int | None:
    """The loop whose iterator has stride 1 in `index` (a head's 64 channels in h * 64 + d),
    if exactly one has; an index not linear in the iterators gives no coefficients."""
    ivs = list(var_of)
    coefs = detect_linear_equation(index, [blk.iter_vars[i].var for i in ivs])
    unit = [var_of[i] for i, c in zip(ivs, list(coefs)[:-1]) if _is_one(c)]
    return unit[0] if len(unit) == 1 else None


def _gathered_loop(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list) -> int | None:
    """The loop along which a spatial block reads an input element by element, when that input
    is read elsewhere at positions computed from the data (a range in its access region, as a
    resize's or a gather's) and the innermost loop takes no part in the element read."""
    axes = _element_axes(sch, block, loops)
    if axes is None:
        return None
    blk, var_of, inner_var = axes
    for region in blk.reads:
        dims = region.region
        if not dims or any(_uses(r.min, inner_var) for r in dims) or all(_is_one(r.extent) for r in dims[:-1]):
            continue
        unit = _unit_loop(blk, var_of, dims[-1].min)
        if unit is not None and unit != len(loops) - 1:
            return unit
    return None


def _transposed_loop(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list, lanes: int) -> int | None:
    """The loop (index into `loops`) along which some input of a spatial block is contiguous,
    when that is not the innermost loop, along which the output is: a transpose, whose
    vectors then gather from rows `stride` apart. Only where both axes span a tile of `lanes`
    (small axes, such as an image's 3 channels or 7 columns, are left to the plain schedule)."""
    axes = _element_axes(sch, block, loops)
    if axes is None or (_extent(sch, loops[-1]) or 0) < lanes:
        return None
    blk, var_of, inner_var = axes
    for region in blk.reads:
        if not region.region or _uses(region.region[-1].min, inner_var):
            continue
        if not any(_uses(r.min, inner_var) for r in region.region[:-1]):
            continue  # broadcast along the innermost axis, not a transpose
        unit = _unit_loop(blk, var_of, region.region[-1].min)
        if unit is not None and unit != len(loops) - 1 and (_extent(sch, loops[unit]) or 0) >= lanes:
            return unit
    return None


def _transpose_tile(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, across: int, width: int | None, lanes: int
) -> int | None:
    """Input rows a transpose's tile reads (see _schedule_spatial), `across` rows in all:
    `lanes`, else the largest divisor of them down to half that: a partial tile's predicate
    made the vector loop inside it scalar (ConvNeXt-T's 96x56x56 -> 56x56x96: 0.71x of the
    untiled kernel in tiles of 16, 1.69x in tiles of 14). None (no tiles): where that leaves
    a partial tile under whole vectors, and where no vector divides the output rows of a
    transpose L1 holds whole (ViT's 17 x 128 keys: 1.2 us as plain loops, 2.5 in scalar tiles)."""
    blk = sch.get(block)
    if width is None and _work(sch, block) * tvm.DataType(blk.writes[0].source.dtype).bits // 8 <= L1_BYTES:
        return None
    whole = next((t for t in range(lanes, lanes // 2 - 1, -1) if across % t == 0), None)
    return whole or (lanes if width is None else None)


def _schedule_reduction(
    sch: s_tir.Schedule,
    block: s_tir.schedule.SBlockRV,
    s_loops: list,
    r_loops: list,
    lanes: int,
    tile: bool,
    s_vars: list[str],
    acc: int,
) -> s_tir.schedule.LoopRV | None:
    if tile and not _reuses_inputs(sch, block):
        par = _accumulate_vectors(sch, block, s_loops, r_loops, lanes, s_vars, acc)
        if par is not None:
            return par
    # register tiles only where an input is reused across an output axis (matmul, conv): a
    # pooling window has nothing to keep in registers, and its tile ran 5x slower than the
    # plain loop (SqueezeNet's 3x3 max pool: 108 vs 21 us)
    tile = tile and _reuses_inputs(sch, block)
    if tile and len(s_loops) >= 2:
        par = _gemm_tiles(sch, block, s_loops, r_loops, lanes, _row_loop(sch, block, s_vars), s_vars, acc)
        if par is not None:
            return par
    if tile and len(s_loops) == 1:
        # one output row (a batch-1 classifier head, x[1, K] @ W[K, N]; unit axes are dropped):
        # a unit row gives it the register tile, k outside and N vectorised, instead of a dot
        # product per output down a strided column of W (EfficientNet's 1280x1000 head: 1.3 ms)
        par = _gemm_tiles(sch, block, [sch.add_unit_loop(block), *s_loops], r_loops, lanes, 0, ["", *s_vars], acc)
        if par is not None:
            return par
    parallel = _work(sch, block) >= MIN_PARALLEL_WORK
    index_only = _index_only_loop(sch, block, s_loops)
    if index_only is not None:
        outer = s_loops[:index_only] + s_loops[index_only + 1:]
        sch.reorder(*outer, *r_loops, s_loops[index_only])
        par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        if parallel:
            sch.parallel(par)
        sch.decompose_reduction(block, r_loops[0])
        return par
    inner = s_loops[-1] if len(s_loops) >= 2 else None
    inner_ext = _extent(sch, inner) if inner is not None else None
    width = _vector_width(inner_ext, lanes) if inner is not None else None
    vectorise = width is not None
    # i-k-j: the innermost output axis inside the reduction, vectorised where a width divides it;
    # a short one that does not (17 attention tokens) stays serial, as independent accumulators
    # LLVM can pipeline or vectorise itself, rather than one latency-bound chain per output
    inner_in = vectorise or (inner_ext is not None and 1 < inner_ext <= SERIAL_INNER)
    outer = s_loops[:-1] if inner_in else s_loops
    sch.reorder(*outer, *r_loops, *([inner] if inner_in else []))
    par = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    if parallel and par is not None and (_extent(sch, par) or 2) > 1:
        sch.parallel(par)
    if vectorise:
        vi = sch.get_loops(block)[-1]
        if inner_ext and width and inner_ext > width:
            _, vi = sch.split(vi, [None, width])
        sch.vectorize(vi)
    # the init leaves the reduction loop; vectorising needs the reduction block intact first
    sch.decompose_reduction(block, r_loops[0])
    return par


def _index_only_loop(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, s_loops: list) -> int | None:
    """Of the outer spatial loops (indices into `s_loops`), the longest whose iterator a block
    that computes where to read from the data (a range in an input's access region) and
    computes it at a cost (_COSTLY) uses only as a whole index: RoiAlign's channels, beside the
    bilinear sample positions of each box's bin. Run innermost, inside the reduction, the
    positions are computed once for all of its values (LLVM hoists them) instead of once per
    value: Faster R-CNN's 64 boxes x 256 channels x 7 x 7 bins, 15.6 -> 6.2 ms."""
    blk = sch.get(block)
    if len(s_loops) < 2 or not _computes_costly(blk.body) or all(
            all(_is_one(r.extent) for r in region.region) for region in blk.reads):
        return None
    loops = sch.get_loops(block)
    driven = _driven(sch, block, loops)
    if driven is None:
        return None
    drives = {sch.get(lp): ivs for lp, ivs in zip(loops, driven)}
    text, best, best_extent = _body_text(blk.body), None, 0
    for k, lp in enumerate(s_loops[:-1]):
        ivs, extent = drives.get(sch.get(lp), set()), _extent(sch, lp) or 0
        if len(ivs) != 1 or extent <= best_extent:
            continue
        var = blk.iter_vars[next(iter(ivs))].var
        places = {region.source.name: d for region in list(blk.reads) + list(blk.writes)
                  for d, r in enumerate(region.region) if r.min.same_as(var) and _is_one(r.extent)}
        if only_indexes(text, str(var.name), places):
            best, best_extent = k, extent
    return best


def _accumulate_vectors(
    sch: s_tir.Schedule,
    block: s_tir.schedule.SBlockRV,
    s_loops: list,
    r_loops: list,
    lanes: int,
    s_vars: list[str],
    acc: int,
) -> s_tir.schedule.LoopRV | None:
    """A reduction across outer axes of its input, contiguous along its innermost output axis
    (channels-last pooling windows and global pools, column sums): a group of output vectors,
    unrolled, accumulates in registers over the whole reduction, groups in parallel.

    The loop nests it replaces kept the outputs in memory across the reduction: vectors inside
    the window, ResNet's 3x3 max pool took 49 us (2.3 with its 4 vectors unrolled: the inlined
    padding's test is hoisted out of the group); a column sum ran a serial dot product down each
    column (512x1024: 1.29 ms; 30 us in groups of 8 vectors). None when the rule does not
    apply (the last output axis is not vectorisable or not innermost in what the block reads)."""
    if not s_loops or _reduces_innermost(sch, block):
        return None
    reads = [r for r in sch.get(block).reads if r.region]
    if not reads or not all(_names(str(r.region[-1].min), s_vars[-1]) for r in reads):
        return None
    ext = _extent(sch, s_loops[-1])
    width = _vector_width(ext, lanes)
    if width is None:
        return None
    vectors = ext // width
    group = max(g for g in range(1, min(acc, vectors) + 1) if vectors % g == 0)
    parallel = _work(sch, block) >= MIN_PARALLEL_WORK
    groups, vec, lane = sch.split(s_loops[-1], [None, group, width])
    sch.reorder(*s_loops[:-1], groups, *r_loops, vec, lane)
    par = sch.fuse(*s_loops[:-1], groups) if s_loops[:-1] else groups
    sch.vectorize(lane)
    sch.unroll(vec)
    if parallel and (_extent(sch, par) or 2) > 1:
        sch.parallel(par)
    sch.decompose_reduction(block, r_loops[0])
    return par


def _reads_naming(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, var: str) -> list[str]:
    """The block's read regions, printed, that index with the variable named `var`."""
    return [str(r) for r in sch.get(block).reads if _names(str(r), var)]


def _read_bytes(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, keep: Callable[[str], bool]) -> int:
    """Bytes of the buffers the block reads whose printed read region satisfies `keep` (a
    dimension of unknown extent counted as large)."""
    sizes = {}
    for region in sch.get(block).reads:
        if keep(str(region)):
            buf = region.source
            elements = math.prod(int(d) if isinstance(d, tirx.IntImm) else 1 << 20 for d in buf.shape)
            sizes[buf.name] = elements * tvm.DataType(str(buf.dtype)).bits // 8
    return sum(sizes.values())


def _row_loop(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, s_vars: list[str]) -> int:
    """Which spatial loop indexes the accumulator's rows: the innermost one (besides the
    vectorised last) whose variable is absent from every input the last one reads, so each
    vector load is reused by all rows (matmul: i against B[k, j]; conv: the output channel, not
    the image row, against the input window)."""
    j_inputs = _reads_naming(sch, block, s_vars[-1])
    for k in reversed(range(len(s_vars) - 1)):
        if not any(_names(r, s_vars[k]) for r in j_inputs):
            return k
    return len(s_vars) - 2


# longest output axis kept as a serial loop inside a reduction (i-k-j order) when no vector width
# divides it
SERIAL_INNER = 64

# the smallest L1 data cache of the hosts measured (AMD Zen 3 and 4: 32 KiB; Intel: 48)
L1_BYTES = 32 << 10
# the smallest L2 cache per core of the hosts measured (AMD EPYC, Zen 3): what `l2_bytes` assumes
# where the machine does not say
L2_BYTES = 512 << 10


@functools.lru_cache(maxsize=1)
def l2_bytes() -> int:
    """This machine's L2 cache per core (L2_BYTES where Linux's sysfs does not say): weights
    larger than this are streamed from L3 or memory by every tile that reads them all."""
    return _cache_bytes(Path("/sys/devices/system/cpu/cpu0/cache"), level=2) or L2_BYTES


def _cache_bytes(root: Path, level: int) -> int | None:
    """The data (or unified) cache of `level` described under a sysfs cache directory."""
    for index in sorted(root.glob("index*")):
        try:
            if int((index / "level").read_text()) == level and (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip().upper()
                return int(size[:-1]) << {"K": 10, "M": 20}[size[-1]] if size[-1] in "KM" else int(size)
        except (OSError, ValueError):
            return None
    return None


# accumulator registers a register tile may use; the rest hold the broadcast inputs, the weight
# vectors and LLVM's temporaries. AVX-512 has 32 vector registers: 24 accumulators (8x3 tiles:
# 11 loads feed 24 FMAs per step, against 10 for 16 with 8x2). On an Intel AVX-512 host
# (kernels v19) BERT-base's GEMMs ran 1.05-1.07x faster than with 16 and the libraries built
# with 24 were 1.049x (BERT-base), 1.014x (ResNet-50) and 1.039x (MobileNetV2-224) faster end
# to end (`kernel_ab.py --acc 16,24,20`, `library_ab.py`, paired); on an AMD Zen 5 host 24 and 16
# were within noise on ResNet-50's convolutions (16 had been chosen by a sweep on AVX2-era
# models). AVX2 has 16 registers: an 8x2 tile spilled its accumulators to the stack on every
# step of the reduction; 12 (6x2) fit, and ran the transformer block's GEMMs 1.5-2x faster (sum
# of its kernels 63 -> 39 us; 8 accumulators: 41 us, and ViT's 17-token GEMMs 1.3x slower than
# with 12).
ACCUMULATORS = 24
AVX2_ACCUMULATORS = 12
# streamed weights (see _stream_chunk): constant weights of at least STREAM_BYTES that outweigh
# the rows they meet, read in chunks of a column tile's panel of at most STREAM_CHUNK_BYTES (a
# third of a 48 KiB L1); the next chunk prefetched in bursts of about PREFETCH_BURST cache
# lines, at most every PREFETCH_STEPS reduction steps; rows split into groups where there are
# fewer than STREAM_MIN_TILES column tiles to share out between threads
STREAM_BYTES = 256 << 10
STREAM_CHUNK_BYTES = 16 << 10
PREFETCH_STEPS = 16
PREFETCH_BURST = 8
STREAM_MIN_TILES = 8
CACHE_LINE = 64
PREFETCH_ATTR = "autofuse_prefetch"
# on the loop over register tiles whose rows the tile size does not divide: "rows:tile"; and
# on a kernel whose last tile of rows overlaps the one before it, computing rows twice (see
# _overlap_last_tile): it must not write over an input it reads (inplace.py)
OVERLAP_ATTR = "autofuse_overlap_rows"
RECOMPUTES_ATTR = "autofuse.recomputes_rows"
# TVM's limit for putting a buffer on the stack (runtime::kMaxStackAlloca): a buffer of this
# size or more, or not in global scope, is allocated from the workspace pool wherever it lives
STACK_BYTES = 1024
# how much better (FMAs per load, _tile_score) a tile over rows merged across image rows must be
# than one that divides the image row, to pay for re-laying the block (_image_rows): merged 9x2
# tiles against 7x2 ones on Inception-v3's 147-pixel rows scored 1.05x and ran 0.88x (3x3 32 ->
# 64); at margin 1.1 the 31 kernels it changed in seven timm CNNs ran 0.98-1.74x, 1.02-1.27x a
# model (`scripts/schedule_ab.py`, AMD EPYC), and no kernel changes between 1.1 and 1.3
MERGE_MARGIN = 1.1
# the margin also applies where the own tile does not divide the image row, if the reduction is
# shorter than this: each tile then recomputes its straddled windows' indices for a few FMAs
# (Inception-v3's RGB stem, 3x3x3 stride 2 into 149x149x32: 466 -> 206 us unmerged,
# `schedule_ab.py`; at 513 and 321 pixels 1.16x and 1.10x as a module with its transposes).
# Longer ones merge as before: its 17x17 1x1 convolutions ran 0.81-0.86x unmerged
SHORT_REDUCTION = 64


def accumulators(vector_bits: int) -> int:
    """Accumulator registers for a CPU of the given SIMD width (see ACCUMULATORS)."""
    return ACCUMULATORS if vector_bits >= 512 else AVX2_ACCUMULATORS


def _broadcast_rows(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, i_var: str, j_var: str) -> bool:
    """Whether each row's input is one broadcast per step: no read indexed by the row also
    depends on the column (matmul, conv; not a depthwise conv)."""
    return not any(_names(r, j_var) for r in _reads_naming(sch, block, i_var))


def _image_rows(
    sch: s_tir.Schedule,
    block: s_tir.schedule.SBlockRV,
    s_loops: list,
    s_vars: list[str],
    row: int,
    lanes: int,
    acc: int,
    r_loops: list,
) -> tuple[list, list[str], int, bool, list, tuple[int, int] | None]:
    """An image row merged with the image row above it, so that a register tile takes its
    rows from the whole image: (s_loops, s_vars, row, whether merged, r_loops, what
    `_flatten_rows` left to re-lay). Two rows of a 2x2 image filled 4 of 12 accumulators and
    streamed the weights once per image row (ResNeXt's 1024 -> 2048 1x1 convolution, cold: 709
    -> 520 us); 7- and 14-pixel rows took 7x1 tiles or padded 5-row ones. Only where the
    weights do not depend on the image row either. Where tiles hold whole image rows the loops
    are fused; where they would straddle two (5 rows of a 5x2 batch; 4-row tiles over 7x7)
    the block and its epilogues are re-laid (`_flatten_rows`), and only where the merged
    rows' tile beats the image row's own (by MERGE_MARGIN where that divides the image row or
    the reduction is short)."""
    unchanged = s_loops, s_vars, row, False, r_loops, None
    if row == 0 or row != len(s_loops) - 2:
        return unchanged
    ext_up, ext_row, ext_j = (_extent(sch, s_loops[k]) for k in (row - 1, row, -1))
    if ext_up is None or ext_row is None or ext_up == 1:
        return unchanged
    if any(_names(r, s_vars[row - 1]) for r in _reads_naming(sch, block, s_vars[-1])):
        return unchanged
    width = _lane_width(sch, block, s_vars[-1], ext_j, lanes)
    if width is None:
        return unchanged
    rows, wide = ext_up * ext_row, _broadcast_rows(sch, block, s_vars[row], s_vars[-1])
    ti, tv = _tile_shape(rows, ext_j // width, acc, wide)
    if ext_row < acc // 2 and rows % ti == 0 and ti % ext_row == 0:
        s_loops = [*s_loops[: row - 1], sch.fuse(s_loops[row - 1], s_loops[row]), s_loops[-1]]
        return s_loops, [*s_vars[: row - 1], s_vars[row], s_vars[-1]], row - 1, True, r_loops, None
    own = _tile_shape(ext_row, ext_j // width, acc, wide)
    ti, tv = _tile_shape(rows, ext_j // width, acc, wide, predicated=True)
    short = _reduction_size(sch, r_loops) < SHORT_REDUCTION
    if (ext_row % own[0] == 0 or short) and _tile_score(*own, ext_row) * MERGE_MARGIN >= _tile_score(ti, tv, rows):
        return unchanged
    if rows % ti and rows < 8 * ti:
        # a partial last tile is predicated: where it is more than one tile in eight, that
        # cost more than the merge gained (SqueezeNet's 3x3 images, 9 rows as a 5-row tile and
        # a predicated one: 0.6x against 3-row tiles; a 7x7 image in 6-row tiles, the ninth
        # predicated: 1.4x)
        return unchanged
    flat = _flatten_rows(sch, block, s_vars[row - 1], s_vars[row])
    if flat is None:
        return unchanged
    loops = sch.get_loops(block)
    spatial = [int(iv.iter_type) != _REDUCE for iv in sch.get(block).iter_vars]
    s_loops = [lp for lp, sp in zip(loops, spatial) if sp]
    r_loops = [lp for lp, sp in zip(loops, spatial) if not sp]
    s_vars = [str(iv.var) for iv in sch.get(block).iter_vars if int(iv.iter_type) != _REDUCE]
    return s_loops, s_vars, row - 1, True, r_loops, flat


def _reduction_size(sch: s_tir.Schedule, r_loops: list) -> int:
    """Multiply-adds per output of a matmul/conv block (a run-time extent counts as many)."""
    return math.prod(_extent(sch, lp) or 1 << 10 for lp in r_loops)


def _flatten_rows(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, up_var: str, row_var: str
) -> tuple[int, int] | None:
    """Merge the image-row axis `up_var` and the row axis `row_var` of a matmul/conv block into
    one axis of rows, so that register tiles may straddle image rows (a 7x7 image as 49 rows in
    6x2 tiles rather than 7-row tiles one vector wide; a 14x14 one as 196 rows in 4-row tiles
    rather than 5-row ones over a padded copy). The block's iteration space is re-laid
    (transform_block_layout); so is its output where it is an intermediate buffer, and every
    elementwise epilogue reading it: TIR computes the region a tile covers as a box in the
    buffer's dimensions, and a box around rows that straddle two image rows covers outputs the
    tile never computed (wrong results, seen on an LSTM). Returns (dimension, width) of the
    output buffer still to be re-laid where it is a parameter (the tile's accumulator, after
    cache_write), (-1, 0) where nothing is left to do, or None where the block or its
    consumers do not have that shape (nothing changed)."""
    blk = sch.get(block)
    names = [str(iv.var) for iv in blk.iter_vars]
    if up_var not in names or names.index(row_var) != names.index(up_var) + 1 or len(blk.writes) != 1:
        return None
    pos = names.index(up_var)
    dim = _merged_dims(blk.writes[0], blk.iter_vars[pos].var, blk.iter_vars[pos + 1].var)
    if dim is None:
        return None
    out = blk.writes[0].source
    params = {buf.name for buf in sch.mod["main"].params}
    width = int(out.shape[dim + 1])
    consumers = []
    if out.name in params and sch.get_consumers(block):
        return None  # a parameter read back in the kernel: its readers would need re-laying too
    if out.name not in params:
        for consumer in sch.get_consumers(block):
            found = _elementwise_rows(sch, consumer, out, dim, params)
            if found is None:
                return None
            consumers.append((consumer, found))
    dtype = str(blk.iter_vars[pos].var.ty.dtype)
    try:
        sch.transform_block_layout(block, _merge_map(pos, width, len(names), dtype))
    except _REFUSED:
        return None  # refused before any change
    if out.name in params:
        return dim, width
    try:
        sch.transform_layout(block, ("write", 0), _merge_map(dim, width, len(out.shape), dtype))
        for consumer, (k, n) in consumers:
            sch.transform_block_layout(consumer, _merge_map(k, width, n, dtype))
    except _REFUSED:
        raise _Unflattened from None
    return -1, 0


class _Unflattened(RuntimeError):
    """A layout transform half done: the schedule is abandoned (the next candidate is taken)."""


def _merged_dims(region: object, up: tirx.Var, row: tirx.Var) -> int | None:
    """The dimension d of a buffer region indexed [..., up, row, ...] at d, d + 1 (one element)."""
    index = region.region  # type: ignore[attr-defined]
    for d in range(len(index) - 1):
        if index[d].min.same_as(up) and index[d + 1].min.same_as(row):
            if all(_is_one(r.extent) for r in index):
                return d
    return None


def _elementwise_rows(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, buf: object, dim: int, params: set[str]
) -> tuple[int, int] | None:
    """(position of the iterator reading dimension `dim` of `buf`, number of iterators) for an
    epilogue that reads `buf` one element at a time at its own adjacent iterators and writes
    only parameters (a deeper chain would meet the same box problem one stage later)."""
    blk = sch.get(block)
    if any(w.source.name not in params for w in blk.writes):
        return None
    vars_ = [iv.var for iv in blk.iter_vars]
    found = set()
    for region in blk.reads:
        if region.source.same_as(buf):
            k = next((i for i, v in enumerate(vars_[:-1]) if region.region[dim].min.same_as(v)), None)
            if k is None or _merged_dims(region, vars_[k], vars_[k + 1]) != dim:
                return None
            found.add(k)
    return (found.pop(), len(vars_)) if len(found) == 1 else None


def _merge_map(pos: int, width: int, ndim: int, dtype: str) -> tirx.IndexMap:
    def merge(*x):  # noqa: ANN202 - an index map
        return [*x[:pos], x[pos] * width + x[pos + 1], *x[pos + 2:]]

    return tirx.IndexMap.from_func(merge, ndim=ndim, index_dtype=dtype)


def _gemm_tiles(
    sch: s_tir.Schedule,
    block: s_tir.schedule.SBlockRV,
    s_loops: list,
    r_loops: list,
    lanes: int,
    row: int,
    s_vars: list[str],
    acc: int,
) -> s_tir.schedule.LoopRV | None:
    """Register tiles for matmul/conv-like blocks: a (rows x 1-2 vectors) accumulator kept in a
    local buffer across the whole reduction, rows unrolled, columns vectorised; tiles in
    parallel. `acc`: accumulator registers (see ACCUMULATORS)."""
    wide = _broadcast_rows(sch, block, s_vars[row], s_vars[-1])  # as rows merge below, too
    if not wide:
        width = _lane_width(sch, block, s_vars[-1], _extent(sch, s_loops[-1]), lanes)
        acc = min(acc, _stack_accumulators(sch, block, width or lanes))
    s_loops, s_vars, row, fused_rows, r_loops, flat = _image_rows(sch, block, s_loops, s_vars, row, lanes, acc, r_loops)
    i, j = s_loops[row], s_loops[-1]
    others = [lp for k, lp in enumerate(s_loops[:-1]) if k != row]
    ext_i, ext_j = _extent(sch, i), _extent(sch, j)
    width = _lane_width(sch, block, s_vars[-1], ext_j, lanes)
    image_row = None
    if width is None and ext_j is not None and others and row != len(s_loops) - 2:
        # small images (4x4, 8x8 feature maps): vectorise over the fused image rows and columns
        image_row = ext_j
        j = sch.fuse(others.pop(), j)
        ext_j = _extent(sch, j)
        width = _vector_width(ext_j, lanes)
    pad_j = 0
    if width is None and ext_j is not None and ext_j > SERIAL_INNER and j is s_loops[-1] and not fused_rows:
        width, pad_j = _padded_width(sch, block, s_vars[-1], ext_j, lanes)
    if ext_i is None or ext_j is None or width is None:
        return None
    vectors = (ext_j + pad_j) // width
    if ext_i == 1:  # one row: the accumulators go to columns, whole cache lines of B per k
        ti, tv = 1, max(v for v in range(1, acc // 2 + 1) if vectors % v == 0)
    else:
        ti, tv = _tile_shape(ext_i, vectors, acc, wide, fused_rows)
    if image_row is not None and _straddles(tv * width, image_row):
        # a column tile over fused image rows must hold whole rows or lie within one: its
        # write-back covers a box of whole image rows, outputs it never computed included (a
        # 6x6 transposed convolution's 4-pixel tiles wrote garbage over their neighbours')
        if _straddles(width, image_row):
            return None
        tv = 1
    tj = tv * width
    copies_in: list = []
    copies_out: list = []
    if (ext_i % ti or pad_j) and j is s_loops[-1] and not fused_rows:
        padded = _pad_axes(sch, block, {row: ti if ext_i % ti else 1, len(s_loops) - 1: width if pad_j else 1})
        if padded is None and pad_j:
            return None
        if padded is not None:
            copies_in, copies_out, s_loops, r_loops = padded
            i, j = s_loops[row], s_loops[-1]
            others = [lp for k, lp in enumerate(s_loops[:-1]) if k != row]
    block_vars = {str(iv.var): iv.var for iv in sch.get(block).iter_vars}
    panels = {block_vars[s_vars[row]]: ti} if s_vars[row] in block_vars and not fused_rows else {}
    if j is s_loops[-1] and s_vars[-1] in block_vars:
        panels[block_vars[s_vars[-1]]] = tj
    packed = _pack_weights(sch, block, panels)
    partial = bool((_extent(sch, i) or 0) % ti)
    io, ii = sch.split(i, [None, ti])  # without padding, a partial last tile is predicated
    jo, ji = sch.split(j, [None, tj])
    # weights that do not stay in L2 are streamed once: column tiles outermost, where they
    # also outweigh the rows they meet (one tile's panel then serves every row from L1/L2), in
    # blocks that fit L2 where not (_column_blocks). Otherwise row tiles outermost: a big
    # image's rows against a few KiB of weights (ResNeXt's 16x16 images 1.1x slower with
    # columns outermost), or weights that L2 holds anyway (ViT's 128 x 512 projections 1.1x
    # slower). ResNeXt's 0.5-8 MB weights on 8x8 and smaller images (cold): 1.1-1.5x faster
    weights = _read_bytes(sch, block, lambda r: _names(r, s_vars[-1]) and not _names(r, s_vars[row]))
    rows = _read_bytes(sch, block, lambda r: _names(r, s_vars[row]))
    beyond_l2 = weights >= l2_bytes()
    columns_outer = beyond_l2 and weights > rows
    order = [jo, *others, io] if columns_outer else [*others, io, jo]
    streamed = None
    if packed and weights >= max(STREAM_BYTES, rows) and not _reused(sch, weights):
        streamed = _stream_tiles(sch, packed[0], tj, jo, [*others, io], r_loops, [ii, ji], partial)
    if streamed is not None:
        order, r_loops, reduce_top = streamed
    else:
        if beyond_l2 and not columns_outer:
            order = _column_blocks(sch, jo, others, io, weights)
        sch.reorder(*order, *r_loops, ii, ji)
        reduce_top = r_loops[0]
    parallel = _work(sch, block) >= MIN_PARALLEL_WORK
    # a streamed column's accumulators hold all its rows (see _stream_tiles): never stack-sized
    scope = "local" if streamed is not None else _tile_scope(sch, block, ti * tj)
    par = sch.fuse(*order)
    tile = par  # the loop over register tiles, where the accumulators and epilogues live
    if parallel:
        run = _tile_run(_extent(sch, par)) if scope == "local" and streamed is None else 1
        if run > 1:
            par, tile = sch.split(par, [None, run])
        sch.parallel(par)
    local = sch.cache_write(block, 0, scope)
    if flat is not None and flat[0] >= 0:  # the accumulator of rows merged across an output parameter
        dtype = str(sch.get(block).iter_vars[0].var.ty.dtype)
        ndim = len(sch.get(local).iter_vars)
        sch.transform_layout(block, ("write", 0), _merge_map(flat[0], flat[1], ndim, dtype))
        sch.transform_block_layout(local, _merge_map(flat[0], flat[1], ndim, dtype))
    sch.reverse_compute_at(local, tile)
    if partial and streamed is None and ext_i >= ti and _reduction_size(sch, r_loops) >= SHORT_REDUCTION:
        sch.annotate(tile, OVERLAP_ATTR, f"{ext_i}:{ti}")
    sch.unroll(ii)
    if _slides_along_rows(sch, block, s_vars[row], s_vars[-1], r_loops[-1]):
        sch.unroll(r_loops[-1])
    jio, jii = sch.split(ji, [None, width])
    sch.unroll(jio)
    sch.vectorize(jii)
    sch.decompose_reduction(block, reduce_top)
    _vectorize_inner(sch, local, width)
    for copy in copies_in:  # the padded input: copied once, not by every column tile
        _schedule_spatial(sch, copy, sch.get_loops(copy), lanes)
    for copy in copies_out:  # each tile writes back its rows of the output
        sch.reverse_compute_at(copy, tile)
        _vectorize_inner(sch, copy, width)
    return tile


def _stack_accumulators(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, width: int) -> int:
    """Accumulator vectors of a depthwise convolution's register tile: as many as keep its
    buffer (vectors of `width`) under STACK_BYTES, on the stack and in registers (see
    _tile_scope). Past it the buffer comes from the workspace pool and is zeroed, stored and
    copied at every tile, which a reduction over the window's taps alone does not amortise:
    ESE-VoVNet's 56x56x128 3x3 depthwise convolution in 8x2 tiles of 16 lanes (1 KiB) 50-52 us
    alone, in 7x2 tiles 37 us, in 4x2 39."""
    dtype = tvm.DataType(str(sch.get(block).writes[0].source.dtype))
    return max(1, (STACK_BYTES - 1) // (width * dtype.bits // 8))


def _column_blocks(
    sch: s_tir.Schedule, jo: s_tir.schedule.LoopRV, others: list, io: s_tir.schedule.LoopRV, weights: int
) -> list:
    """The register tiles' loop order where the weights do not stay in L2 but the rows they meet
    outweigh them: blocks of column tiles whose panels fill at most half of L2 outermost, then
    the rows, then the column tiles of the block. Row tiles outermost streamed all the weights
    from L3 again for every row tile (RetinaNet's 3x3 256 -> 256 convolutions, 2.4 MB of
    weights: on 100x100 64 ms alone, 47 ms in blocks; on 50x50 13.6 -> 11.6 ms); the inputs
    are now read once per block instead."""
    tiles = _extent(sch, jo)
    if not tiles:
        return [*others, io, jo]
    half = l2_bytes() // 2
    per = max(d for d in range(1, tiles + 1) if tiles % d == 0 and (d == 1 or weights * d // tiles <= half))
    if per == tiles:
        return [*others, io, jo]
    outer, inner = sch.split(jo, [None, per])
    return [outer, *others, io, inner]


def _tile_scope(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, elements: int) -> str:
    """The storage scope of a register tile's accumulator buffer. TVM's lowering puts a buffer
    allocated inside a parallel loop on the stack only in global scope and under STACK_BYTES;
    any other comes from the runtime's workspace pool, one call to allocate and one to free at
    every tile, and its accumulators are stored to that memory at the tile's end. A tile under
    the limit is global (an alloca LLVM keeps in registers: MobileNetV3's 112x112 1x1
    convolution 16 -> 64 channels, 4x2 tiles over K = 16, 332 -> 142 us alone); a larger one
    is local, so that its copy shares the allocation (see _tile_buffers_local)."""
    dtype = tvm.DataType(str(sch.get(block).writes[0].source.dtype))
    return "global" if elements * dtype.bits // 8 < STACK_BYTES else "local"


def _tile_run(tiles: int | None) -> int:
    """Register tiles run one after the other in each parallel iteration, where a tile's
    accumulators come from the workspace pool (see _tile_scope): TIR then allocates them once
    per iteration, not once per tile (MobileNetV3's 112x112 1x1 convolution with its 4x2 tiles
    forced into the pool: 332 -> 171 us alone; on the stack 142 us). At most 16 tiles, a
    divisor of the tile count (a partial run would be predicated), and at least 32 iterations
    left for the threads to share out."""
    if not tiles:
        return 1
    return max((r for r in range(1, 17) if tiles % r == 0 and tiles // r >= 32), default=1)


def _straddles(tile: int, row: int) -> bool:
    """Whether tiles of `tile` elements along rows of `row` elements cross a row's end."""
    return tile % row != 0 and row % tile != 0


def _stream_tiles(
    sch: s_tir.Schedule,
    panel: tirx.Buffer,
    tj: int,
    jo: s_tir.schedule.LoopRV,
    rows: list,
    r_loops: list,
    tile: list,
    partial: bool,
) -> tuple[list, list, s_tir.schedule.LoopRV] | None:
    """Order the register tiles' loops so that a column tile streams its packed weight `panel`
    (see `_stream_chunk`): [column tiles (and row groups): parallel], the outer reduction loops,
    the chunks, all row tiles, [bursts], steps, the tile. Returns (the loops to fuse into the
    parallel one, the reduction loops with the steps last, the loop above which the
    accumulators are initialised), or None where it does not apply.

    None (not streamed) where the rows would be split into groups and the last row tile is
    `partial` (predicated): the predicate then reads the group from the parallel loop (`par %
    groups`), no pass takes it out of the steps, and every tile kept its accumulators in
    memory, loaded and stored at each step (Inception-v3's 7x1 and 1x7 convolutions on 17x17,
    289 rows in 12-row tiles: 0.5-1.3 ms a call in groups, 2.4-3.1x what the same tiles took not
    streamed)."""
    dtype_bytes = tvm.DataType(str(panel.dtype)).bits // 8
    kc = _stream_chunk(sch, r_loops[-1], tj * dtype_bytes)
    groups = _row_groups(sch, jo, rows) if kc else None
    if not kc or not groups or (partial and groups > 1):
        return None
    sch.reorder(jo, *rows, *r_loops, *tile)
    rows_loop = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    order = [jo]
    if groups > 1:
        group, rows_loop = sch.split(rows_loop, [groups, None])
        order = [jo, group]
    # the next chunk's lines prefetched a few at a time, in every row tile and every
    # `kc // spread` reduction steps: fewer bursts where there are many row tiles
    lines = kc * tj * dtype_bytes // CACHE_LINE
    n_rows = _extent(sch, rows_loop) or 1
    spread = next(d for d in range(1, kc // PREFETCH_STEPS + 1)
                  if (kc // PREFETCH_STEPS) % d == 0 and (n_rows * d * PREFETCH_BURST >= lines or d == kc // PREFETCH_STEPS))
    ro, rm, ri = sch.split(r_loops[-1], [None, spread, kc // spread])
    sch.reorder(*order, *r_loops[:-1], ro, rows_loop, rm, ri, *tile)
    # a loop of extent 1 is not a safe mark: later primitives may drop it
    marked, depth = (rm, 2) if spread > 1 else (rows_loop, 1)
    sch.annotate(marked, PREFETCH_ATTR, f"{panel.name}:{-(-lines // (n_rows * spread))}:{depth}:{lines}")
    return order, [*r_loops[:-1], ri], (r_loops[:-1] or [ro])[0]


def _reused(sch: s_tir.Schedule, weights: int) -> bool:
    """Whether the weights are read from L2 at most calls, not streamed from memory: the module
    passes each at several calls (REUSED_ATTR) and they fill at most half of L2. A bidirectional
    LSTM's recurrent weights, 2 x 96 x 384 floats read at each of 16 steps, streamed as if cold:
    the one-node model 1.07x slower (libraries paired)."""
    return bool((sch.mod["main"].attrs or {}).get(REUSED_ATTR)) and weights <= l2_bytes() // 2


def _stream_chunk(sch: s_tir.Schedule, r_loop: s_tir.schedule.LoopRV, panel_row_bytes: int) -> int | None:
    """Reduction steps per chunk when a tile's constant weights are streamed from memory, or None.

    A model's weights do not stay in cache from one run to the next (ResNet-50 reads 94 MB of
    them), so a kernel meets its weights cold. With every row tile sweeping the whole reduction,
    the first tile of each column stalls on memory while the later ones find the panel in L2:
    ResNet-50's 3x3 512-channel convolution ran 715 us warm, 1061 us cold and 1086 us a call in
    the model; onnxruntime's 863 in its model. Instead each column tile walks the
    reduction in chunks of STREAM_CHUNK_BYTES of its panel (kept in L1 while every row tile of
    the column uses them, the accumulators of the column in a buffer of their own), and while
    it computes one chunk it prefetches the next one, a burst of lines at a time spread over
    the chunk's row tiles and steps, so that memory and arithmetic overlap."""
    ext = _extent(sch, r_loop)
    if not ext:
        return None
    chunks = [kc for kc in range(PREFETCH_STEPS, ext // 2 + 1, PREFETCH_STEPS)
              if ext % kc == 0 and kc * panel_row_bytes <= STREAM_CHUNK_BYTES]
    return max(chunks, default=None)


def _row_groups(sch: s_tir.Schedule, columns: s_tir.schedule.LoopRV, rows: list) -> int | None:
    """Into how many groups a streamed column tile's rows split so that there are at least
    STREAM_MIN_TILES parallel tasks (each group reads the column's panel once), or None.
    Rows given as (outer rows, row tiles) loops, an image's rows and the tiles along each, split
    into whole outer rows or within one: each group writes back the box of outer rows it
    touches, and a group ending inside a row wrote over its neighbour's outputs (a convolution
    whose output another one in the kernel reads, YOLOX's 13x13 head: 7 groups of 13 of the
    13 x 7 tiles)."""
    cols = _extent(sch, columns)
    extents = [_extent(sch, lp) for lp in rows]
    if not cols or None in extents:
        return None
    total, outer = math.prod(extents), math.prod(extents[:-1])  # type: ignore[arg-type]
    return next((g for g in range(1, total + 1)
                 if (outer % g == 0 or (g % outer == 0 and total % g == 0)) and cols * g >= STREAM_MIN_TILES), None)


def _insert_prefetches(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Software prefetches where `_gemm_tiles` marked a loop (PREFETCH_ATTR = "buffer:n:depth:lines"): at
    every iteration of the marked loop (inside the row-tile loop, inside the chunk loop), n cache
    lines of the weight panel's next chunk, so that the row tiles of a chunk between them fetch
    all of the next one. TIR's schedule has no prefetch primitive (TE's went with it); this
    rebuilds the statements on the path to the marked loop with the prefetch loop in front of
    its body."""

    def insert(stmt: tirx.Stmt, loops: list) -> tirx.Stmt:
        note = (stmt.annotations or {}).get(PREFETCH_ATTR) if isinstance(stmt, tirx.For) else None
        return stmt if note is None else _with_body(stmt, _prefetched(stmt, loops, str(note)), PREFETCH_ATTR)

    return _map_func(func, insert)


def _prefetched(loop: tirx.For, outer: list, note: str) -> tirx.Stmt:
    """The body of the marked loop `loop` with the prefetch loop before it; the chunk loop is
    `depth` loops up, and the loops from below it down to `loop` number the bursts. The last
    bursts stop at the chunk's `lines` (bursts of a rounded-up size would otherwise reach into
    the chunk after next: an AVX2 tile of 28 rows, 24 lines past it)."""
    name, per, depth, lines = note.rsplit(":", 3)
    chunk, bursts = outer[-int(depth)], [*outer[len(outer) - int(depth) + 1:], loop]
    found = next(((r, t) for r in _nested(loop.body) if isinstance(r, s_tir.SBlockRealize)
                  for t in r.block.reads if t.source.name == name), None)
    if found is None:
        return loop.body
    realize, region = found
    at_block = tirx.IndexMap([iv.var for iv in realize.block.iter_vars], [r.min for r in region.region], None)
    index = at_block.map_indices(list(realize.iter_values))  # the weight read, in loop variables
    inner = [chunk.loop_var, *[f.loop_var for f in bursts], *[f.loop_var for f in _nested(loop.body) if isinstance(f, tirx.For)]]
    dtype = chunk.loop_var.ty.dtype
    zero = tirx.const(0, dtype)
    to_next = tirx.IndexMap(inner, index, None)  # the same read at the start of the next chunk
    index = to_next.map_indices([chunk.loop_var + tirx.const(1, dtype), *[zero] * (len(inner) - 1)])
    q = tirx.Var("q", dtype)
    burst = zero
    for f in bursts:
        burst = burst * f.extent + f.loop_var
    line = burst * int(per) + q
    elems = CACHE_LINE * 8 // tvm.DataType(str(region.source.dtype)).bits
    index = [*index[:-1], index[-1] + line * tirx.const(elems, dtype)]  # row-major: one flat stream
    address = tirx.address_of(tirx.BufferLoad(region.source, index))
    fetch = tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", address, tirx.const(0, "int32"),
                                                tirx.const(3, "int32"), tirx.const(1, "int32")))
    fetch = tirx.IfThenElse(line < tirx.const(int(lines), dtype), fetch, None)
    return tirx.SeqStmt([tirx.For(q, zero, tirx.const(int(per), dtype), tirx.ForKind.SERIAL, fetch), loop.body])


def _overlap_last_tile(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Register tiles of rows that the tile size does not divide (OVERLAP_ATTR "rows:tile" on the
    loop over tiles; 37x37 images as 1,369 rows in 12-row tiles), unpredicated: the last tile
    starts `tile` rows before the end, overlapping the one before it, whose rows it computes
    again to the same values, instead of a predicate on every row of every tile. With the
    predicate, LLVM kept the accumulators in memory, loaded and stored at every step of the
    reduction, unless it happened to version the loop (Xception's 1x1 convolution 728 -> 728
    on 37x37: 14.6 ms a call, onnxruntime 6.9). Rewritten after scheduling: the start
    min(start, rows - tile) is no affine binding, which TIR's primitives require. Each block in
    the tile whose predicate bounds a row `start + r` (r a loop of `tile` iterations) reads
    that row at min(start, rows - tile) + r instead; a tile with any other predicate is left
    as it is. The function is marked RECOMPUTES_ATTR: a tile reads the rows of its inputs after
    the tile before it wrote its outputs, so it must not write over an input (inplace.py)."""

    from tvm.sym.analyzer import Analyzer

    ana = Analyzer()

    def rewrite(realize: s_tir.SBlockRealize, loops: list, rows: int, tile: int) -> s_tir.SBlockRealize:
        kept, values = [], list(realize.iter_values)
        for cond in _conjuncts(realize.predicate):
            if not (isinstance(cond, tirx.LT) and isinstance(cond.b, tirx.IntImm) and int(cond.b) == rows):
                kept.append(cond)
                continue
            step = next((f for f in loops if isinstance(f.extent, tirx.IntImm) and int(f.extent) == tile
                         and _is_zero(f.min) and not _uses(ana.simplify(cond.a - f.loop_var), f.loop_var)), None)
            matches = [k for k, v in enumerate(values) if ana.can_prove_equal(v, cond.a)]
            if step is None or not matches:
                raise _KeptPredicate
            start = ana.simplify(cond.a - step.loop_var)
            moved = tirx.Min(start, tirx.const(rows - tile, start.ty.dtype)) + step.loop_var
            for k in matches:
                values[k] = moved
        if len(kept) == len(_conjuncts(realize.predicate)):
            return realize
        predicate = functools.reduce(tirx.And, kept) if kept else tirx.const(True, "bool")
        return s_tir.SBlockRealize(values, predicate, realize.block)

    overlapped = []  # the tiles rewritten

    def overlap(stmt: tirx.Stmt, _outer: list) -> tirx.Stmt:
        mark = (stmt.annotations or {}).get(OVERLAP_ATTR) if isinstance(stmt, tirx.For) else None
        if mark is None:
            return stmt
        rows, tile = (int(x) for x in str(mark).split(":"))
        try:  # every block of the tile, or none (a tile with another predicate stays as it was)
            body = _map_stmts(stmt.body, lambda node, loops: rewrite(node, loops, rows, tile)
                              if isinstance(node, s_tir.SBlockRealize) else node, [stmt])
        except _KeptPredicate:
            body = stmt.body
        overlapped.extend([] if body.same_as(stmt.body) else [stmt])
        return _with_body(stmt, body, OVERLAP_ATTR)

    func = _map_func(func, overlap)
    return func.with_attr(RECOMPUTES_ATTR, True) if overlapped else func


class _KeptPredicate(Exception):
    """A block of a marked tile whose predicate is not a row bound _overlap_last_tile rewrites."""


def _conjuncts(cond: tirx.PrimExpr) -> list:
    """The terms of a chain of ands (a block's predicate)."""
    if isinstance(cond, tirx.And):
        return [*_conjuncts(cond.a), *_conjuncts(cond.b)]
    return [] if isinstance(cond, tirx.IntImm) and int(cond) == 1 else [cond]


def _nested(stmt: tirx.Stmt) -> Iterator[tirx.Stmt]:
    """The loops and block realisations inside `stmt`, outermost first."""
    if isinstance(stmt, (tirx.For, s_tir.SBlockRealize)):
        yield stmt
    if isinstance(stmt, tirx.For):
        yield from _nested(stmt.body)
    elif isinstance(stmt, s_tir.SBlockRealize):
        yield from _nested(stmt.block.body)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _nested(s)


def _slides_along_rows(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, row_var: str, col_var: str, tap: s_tir.schedule.LoopRV
) -> bool:
    """Whether the innermost reduction loop `tap` slides a window along the tile's rows in an
    input read once per row and column (a depthwise convolution: output pixel w reads input
    pixel w + kw). Unrolled, the vector LLVM loads for row w at tap kw is the one row w - 1 needs
    at tap kw + 1, and is loaded once: MobileNetV2-224's ten depthwise convolutions 1.25x warm,
    1.27x cold (`scripts/schedule_ab.py`, 7 rounds; 112x112x32 1.37x, 28x28x192 stride 2 1.85x;
    the 7x7x960 one, a 7x2-vector tile, 0.91x: 8.5 against 7.7 us). Windows of at most 7 taps."""
    ext = _extent(sch, tap)
    if ext is None or not 1 < ext <= 7 or _broadcast_rows(sch, block, row_var, col_var):
        return False
    loop_var = sch.get(tap).loop_var
    blk = sch.get(block)
    realize = sch.get(sch.get_loops(block)[-1]).body  # the block's bindings to its loops
    taps = [str(iv.var) for iv, v in zip(blk.iter_vars, realize.iter_values) if _uses(v, loop_var)]
    return any(_names(str(r.min), row_var) and any(_names(str(r.min), t) for t in taps)
               for region in blk.reads for r in region.region)


def _pack_weights(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, panels: dict) -> list[tirx.Buffer]:
    """Re-lay each constant weight that a register tile reads along one of its axes (a key of
    `panels`, valued by the tile's extent t on it) as panels of that axis: [..., N] ->
    [N / t, ..., t], so that a tile streams its weights sequentially instead of reading one
    cache line per reduction step, N floats apart. The hardware prefetcher does not follow a
    stride that crosses a page at every step: MobileNetV2's 160 -> 1280 1x1 convolution on a
    2x2 image ran 165 us with cold caches as [1, 1, 160, 1280] and 82 us packed (the model's
    weights are cold: it reads 2.6 MB of them per run). The kernel's parameter takes the new shape;
    `pack_constants` re-lays the constants its callers pass, once, at compile time. Only
    parameters the module passes constants at every call are re-laid (LAYOUT_FREE_ATTR, set by
    ScheduleCPU). Returns the buffers it re-laid, as the block now reads them."""
    func = sch.mod["main"]
    free = [func.params[int(k)] for k in (func.attrs or {}).get(LAYOUT_FREE_ATTR, [])]
    packed: list[tirx.Buffer] = []
    if not free or not panels:
        return packed
    for idx, region in enumerate(list(sch.get(block).reads)):
        if not any(region.source.same_as(w) for w in free):
            continue
        index = region.region
        var = index[-1].min
        tile = next((t for v, t in panels.items() if var.same_as(v)), 1)
        extent = int(region.source.shape[-1])
        if (tile <= 1 or extent % tile or not _is_one(index[-1].extent)
                or any(_uses(r.min, var) for r in index[:-1])):
            continue
        dtype = str(region.source.shape[-1].ty.dtype)
        try:
            sch.transform_layout(block, ("read", idx), tirx.IndexMap.from_func(_panels(tile), ndim=len(index), index_dtype=dtype))
        except _REFUSED:
            continue
        packed.append(sch.get(block).reads[idx].source)
    return packed


def _panels(tile: int):  # noqa: ANN202 - an index map: IndexMap.from_func reads its signature
    return lambda *x: [x[-1] // tile, *x[:-1], x[-1] % tile]


def _note_packing(func: tirx.PrimFunc, scheduled: tirx.PrimFunc) -> tirx.PrimFunc:
    """Record in PACKED_ATTR which parameters the schedule re-laid (see `_pack_weights`): those
    whose shape changed, [..., N] -> [N / t, ..., t], as [index, t] pairs."""
    packed = [[k, int(after.shape[-1])] for k, (before, after) in enumerate(zip(func.params, scheduled.params))
              if [int(d) for d in before.shape] != [int(d) for d in after.shape]]
    return scheduled.with_attr(PACKED_ATTR, packed) if packed else scheduled


def pack_array(array: np.ndarray, tile: int) -> np.ndarray:
    """A weight re-laid as `_pack_weights` re-lays its parameter: [..., N] -> [N / t, ..., t]."""
    lead, n = array.shape[:-1], array.shape[-1]
    return np.ascontiguousarray(np.moveaxis(array.reshape(*lead, n // tile, tile), -2, 0))


def _is_one(expr: object) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 1


def _is_zero(expr: object) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 0


def _padded_width(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, j_var: str, ext_j: int, lanes: int
) -> tuple[int | None, int]:
    """(vector width, columns of padding) for a register tile whose columns no vector width
    divides (ViT's 197 tokens as the columns of Q @ K^T; 255 output channels of a detection
    head): the width that does the most useful work per vector, counting the zero columns
    `_pad_axes` adds. Without it such a block fell back to one dot product per output down a
    strided column (ViT-base's Q @ K^T: 10.5 ms a layer, 0.54 padded; 0.59 in onnxruntime).
    Only past SERIAL_INNER columns: fewer run as serial accumulators inside the reduction,
    which the copies in and out of padded buffers cost more than they save (Swin-T's 49-token
    windows: its attention kernels 1.55 ms serial, 4.26 padded). (None, 0) where no width fits
    what the block reads (`_lane_width`)."""
    best: tuple[float, int | None, int] = (1.0, None, 0)
    for width in (lanes, lanes // 2, lanes // 4):
        if width < 4:
            continue
        pad = -ext_j % width
        if _lane_width(sch, block, j_var, ext_j + pad, width) == width:
            best = max(best, (ext_j / (ext_j + pad) * width, width, pad), key=lambda b: b[0])
    return best[1], best[2]


def _pad_axes(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, multiples: dict[int, int]
) -> tuple[list, list, list, list] | None:
    """Pad a matmul-like block's spatial axes (k-th spatial axis -> a multiple of
    `multiples[k]`): the rows to a multiple of the tile's rows, so that no tile is predicated
    (a predicated row keeps its accumulator in memory, loaded and stored at every step of the
    reduction: ViT's 17 tokens in 3-row tiles with a bias epilogue: 59 us for a 17x128x512
    matmul, 25 us for 16 rows), the columns to a multiple of the vector width
    (`_padded_width`). TIR's pad_einsum copies the inputs into zero-padded buffers and the
    result back; a block that is not an einsum (a convolution's input indexed by h + kh) is
    left as it was (None). Returns the input copies, the output copies, the block's new
    spatial loops and its new reduction loops."""
    blk = sch.get(block)
    spatial = [k for k, iv in enumerate(blk.iter_vars) if int(iv.iter_type) == 0]
    padding = [1] * len(blk.iter_vars)
    for axis, multiple in multiples.items():
        padding[spatial[axis]] = multiple
    before = {sch.get(b).name_hint for b in sch.get_producers(block)}
    try:
        sch.pad_einsum(block, padding)
    except _REFUSED:
        return None
    producers = [b for b in sch.get_producers(block) if sch.get(b).name_hint not in before]
    loops = sch.get_loops(block)
    return (producers, list(sch.get_consumers(block)), [loops[k] for k in spatial],
            [lp for k, lp in enumerate(loops) if k not in spatial])


def _tile_shape(rows: int, vectors: int, acc: int, wide: bool = True, predicated: bool = False) -> tuple[int, int]:
    """(rows, vectors) of a register tile over `rows` x `vectors` outputs, the one that reuses
    loads best: three vectors wide over at least 4 rows where they divide the columns and each
    row's input is one broadcast (`wide`; AVX2's 12 accumulators as 4x3 rather than 4x2:
    GoogLeNet's 3x3 convolutions on 16x16 and 8x8 images 1.2x faster), else two vectors, unless
    one vector with more rows reuses loads better (a 7-row image: 7x1 rather than 1x2). A
    depthwise convolution loads a vector of input per row and column: 3 vectors wide, its
    registers spilled (MobileNetV2's: 0.5-0.8x). Where a last partial tile is `predicated`
    rather than padded (rows merged across image rows), three vectors only over whole tiles:
    the predicate's registers spilled them (a 7x7 image's 49 rows against 960 columns: 4x3
    tiles 259 us, 6x2 138 us). Where neither 2 nor 3 divides the vectors but 5 does (40 or 200
    output channels of 8 lanes: EfficientNet's, MobileNetV3's), tiles five vectors wide where
    four rows of them fit (AVX-512's 24 accumulators) rather than one vector wide (a 3x3 conv of
    40 -> 40 channels on 28x28: 16x1 tiles 191-204 us, 4x5 128-138 us; 1x1 convs into 40 or 200
    channels 1.07-1.3x; `scripts/ragged_shapes.py fivewide`. In EfficientNet-B0 and MobileNetV3
    such convolutions are too small a share of the time to show end to end: 0.99x and 1.00x at
    224x224, `library_ab.py`)."""
    widths = (*_five_wide(vectors, acc), 3, 2, 1) if wide else (2, 1)
    shapes = [(_row_tile(rows, acc // v), v) for v in widths if vectors % v == 0]
    shapes = [(ti, tv) for ti, tv in shapes if tv < 3 or (ti >= 4 and not (predicated and rows % ti))]
    return max(shapes, key=lambda s: _tile_score(*s, rows))


def _five_wide(vectors: int, acc: int) -> tuple[int, ...]:
    """(5,) where a tile five vectors wide is the widest choice: see _tile_shape."""
    return (5,) if vectors % 2 and vectors % 3 and not vectors % 5 and acc // 5 >= 4 else ()


def _tile_score(ti: int, tv: int, rows: int) -> float:
    """FMAs per load of a ti x tv tile (ti broadcasts and tv vector loads feed ti*tv FMAs),
    discounted by the padding of the last tile."""
    return ti * tv / (ti + tv) * rows / (-(-rows // ti) * ti)


def _lane_width(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, j_var: str, ext_j: int | None, lanes: int
) -> int | None:
    """The widest vector width (as _vector_width) at which every input of the block is either
    read along the vector axis contiguously or once for all lanes (a broadcast). A grouped
    convolution reads input channel g*8 + c for output channel j in group g = j // 8: over 16
    lanes that is a gather, over 8 aligned lanes one broadcast value (RegNet's 3x3 grouped
    convolutions: 16 lanes gathering ran at 8 GFLOP/s)."""
    from tvm.sym.analyzer import Analyzer

    blk = sch.get(block)
    jv = next((iv.var for iv in blk.iter_vars if str(iv.var) == j_var), None)
    for width in (lanes, lanes // 2, lanes // 4):
        if ext_j is None or width < 4 or ext_j % width:
            continue
        if jv is None or all(_lanes_share(region, jv, width, ext_j // width, Analyzer()) for region in blk.reads):
            return width
    return None


def _lanes_share(region: object, jv: tirx.Var, width: int, blocks: int, ana: object) -> bool:
    """Whether a read is contiguous along `jv` or the same for `width` aligned values of it."""
    index = [r.min for r in region.region]  # type: ignore[attr-defined]
    if not any(_uses(e, jv) for e in index):
        return True
    split, lane = _by_lanes(index, jv, width, blocks, ana)
    if not any(_uses(e, lane) for e in split):
        return True  # one value for all lanes
    return not any(_uses(e, lane) for e in split[:-1]) and not _uses(ana.simplify(split[-1] - lane), lane)  # type: ignore[attr-defined]


def _by_lanes(index: list, jv: tirx.Var, width: int, blocks: int, ana: object) -> tuple[list, tirx.Var]:
    """`index` with `jv` written as outer * width + lane (lane < width, outer < blocks),
    simplified, and the lane variable."""
    dtype = str(jv.ty.dtype)
    outer, lane = tirx.Var("j_outer", dtype), tirx.Var("j_lane", dtype)
    ana.bind(lane, tvm.ir.Range(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, width)))  # type: ignore[attr-defined]
    ana.bind(outer, tvm.ir.Range(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, blocks)))  # type: ignore[attr-defined]
    ana.bind(jv, outer * tirx.IntImm(dtype, width) + lane)  # type: ignore[attr-defined]
    return [ana.simplify(e) for e in index], lane  # type: ignore[attr-defined]


def _row_tile(rows: int, most: int) -> int:
    """Rows per register tile, at most `most`: the largest of at least 4 that divides the rows
    (128 tokens: 4x2 tiles ran 1.25x faster than padded 6x2 ones on AVX2); else the largest
    whose padding of the last tile wastes at most 1/8 of the work, so a prime row count (ViT's
    17 or 197 tokens) still gets a 6- or 8-row tile rather than one row at a time."""
    exact = [t for t in range(4, min(most, rows) + 1) if rows % t == 0]
    if exact:
        return exact[-1]
    for t in range(min(most, rows), 1, -1):
        if (-rows % t) * 8 <= rows:
            return t
    return 1


def whole_tile_rows(rows: int) -> int:
    """The row count, at least `rows`, that a register tile of 4-8 rows divides (6 on AVX2,
    8 on AVX-512: a count with a divisor in 4-6 serves both): where none divides the rows, the
    last tile is predicated, and a convolution (which `pad_einsum` cannot pad) then keeps every
    tile's accumulators in memory. Short rows are left as they are: over 9-25 positions the
    padded copy and its slice cost about what the predicate did (0.6-1.4x, noisy; 33 and 67
    positions 1.3x and 1.8x, `scripts/ragged_shapes.py frames`)."""
    if rows < 32 or any(rows % t == 0 for t in range(4, 9)):
        return rows
    return next(r for r in range(rows, rows + 4) if any(r % t == 0 for t in (4, 5, 6)))


def _vectorize_inner(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, lanes: int, ragged: bool = False) -> None:
    """Vectorise the innermost loop of a block moved into a tile (its extent is the tile's).
    `ragged`: whole vectors and a last partial step where a whole one does not divide it (see
    _ragged_width)."""
    inner = sch.get_loops(block)[-1]
    ext = _extent(sch, inner)
    width = (_ragged_width(ext, lanes) if ragged else None) or _vector_width(ext, lanes)
    if width is None:
        return
    steps = None
    if ext != width:
        steps, inner = sch.split(inner, [None, width])
    try:
        sch.vectorize(inner)
    except _REFUSED:
        return
    if ext % width:
        _peel_last_step(sch, steps)


def _ragged_width(extent: int | None, lanes: int) -> int | None:
    """The vector width of a row that no width divides (ViT's 197 tokens, wav2vec2's 199
    frames), at least two whole vectors long: all steps but the last run whole vectors, the
    last one predicated (`_peel_last_step`). The exp and normalisation of a softmax over such
    rows ran one element at a time (ViT-base's softmax kernel 480 -> 396 us); its max and sum
    accumulate vectors the same way (`_guard_partial`). Preferred to the half or quarter vectors
    that divide some rows: ConViT's 196 tokens ran four lanes wide (softmax over 4 x 196 x 196:
    81 us, 34 us so)."""
    return lanes if extent is not None and extent % lanes and extent >= 2 * lanes else None


def _peel_last_step(sch: s_tir.Schedule, steps: s_tir.schedule.LoopRV | None) -> None:
    """Run the last step of a loop over vector `steps` apart, where it is partial: the others
    then carry no predicate and stay vectors (a predicated vector loop is scalarised whole)."""
    ext = _extent(sch, steps) if steps is not None else None
    if ext and ext > 1:
        try:
            sch.loop_partition(steps, [ext - 1, None])
        except _REFUSED:
            pass


def schedule_cpu(func: tirx.PrimFunc, lanes: int | None = None, acc: int = ACCUMULATORS) -> tirx.PrimFunc | None:
    """A scheduled copy of `func`, or None if the rule does not apply (left as it is).

    `lanes`: float32 vector width of the target CPU (16 with AVX-512, 8 with AVX2); `acc`: the
    accumulator registers of a register tile (`accumulators(vector_bits)`).
    """
    return next(schedule_candidates(func, lanes, acc), None)


def schedule_candidates(
    func: tirx.PrimFunc, lanes: int | None = None, acc: int = ACCUMULATORS
) -> Iterator[tirx.PrimFunc]:
    """The rule-based schedules that apply to `func`, best first: a row kernel, register tiles,
    the plain schedule, parallel outer loops. A schedule TIR accepts can still fail to lower
    (ShuffleNet's conv + concat + channel shuffle, register-tiled: "buffer used before its
    definition"); build.compile_repairing then takes the next one for that kernel. A kernel
    reaches here unsplit from compile_repairing and the scripts (build.schedule splits first).
    A kernel over a run-time number of rows gets these schedules of a chunk of rows, looped
    (run_time_rows)."""
    lanes = lanes or vector_lanes(func)
    if not static_buffers(func):
        from autofuse.run_time_rows import chunked_candidates

        yield from chunked_candidates(func, lambda chunk: schedule_candidates(chunk, lanes, acc))
        return
    func = split_unit_reductions(func)
    makers = (lambda: _schedule_rows(func, lanes, acc), lambda: _schedule(func, lanes, True, acc),
              lambda: _schedule(func, lanes, False, acc), lambda: _parallel_outer(func))
    for make in makers:
        try:
            scheduled = make()
        except _REFUSED:
            continue
        if scheduled is not None:
            yield _note_packing(func, scheduled)


def new_schedule(func: tirx.PrimFunc) -> s_tir.Schedule:
    """A schedule whose refused primitives fail cheaply. The rules try primitives and take a
    refusal as an answer (inline this block? parallelise this loop?); TVM's default error
    rendering prints the whole function into each refusal's message, and trying to inline each
    block of a 256-op group (RWKV's unrolled recurrence, fused whole) took 381 s, 1.6 s without."""
    return s_tir.Schedule(func, error_render_level="none")


def _parallel_outer(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    # kernels the block analysis cannot normalise (several reductions over different axes, as in
    # layer-norm or softmax): run each top-level loop nest's outer loop in parallel, where TIR
    # proves it legal
    sch = new_schedule(func)
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


def split_unit_reductions(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with each reduction over axes of one element (a 1x1 convolution of one input
    channel, a matmul with K = 1: an outer product) written as the spatial block it amounts to
    (its update with the accumulator read as the init value), or, where the update has another
    form, split into its init and update blocks. Whole, DLight's normalize_prim_func drops such
    axes and leaves a spatial block that keeps its init, into which TIR's
    reverse_compute_inline puts a fused epilogue twice, in the init and in the update, which
    then reads the epilogue's output back as its accumulator (ONNX's test_qlinearconv: every
    output 255 with TVM's plan; an outer product + Relu + Add wrong, on the CPU and under DLight
    alike). Every scheduler runs on the result."""
    def unit(block: s_tir.SBlock) -> bool:
        reduce = [iv for iv in block.iter_vars if int(iv.iter_type) == _REDUCE]
        return block.init is not None and bool(reduce) and all(_is_one(iv.dom.extent) for iv in reduce)

    left = []  # the unit reductions _as_spatial cannot rewrite

    def rewrite(block: s_tir.SBlock) -> s_tir.SBlock:
        spatial = _as_spatial(block) if unit(block) else block
        left.extend([block] if spatial is None else [])
        return spatial or block

    func = _map_blocks(func, rewrite)
    if not left:  # kernels without blocks to schedule (a scan written as TIR loops) end here too
        return func
    sch = new_schedule(func)
    changed = False
    for block in sch.get_child_blocks(sch.get_sblock("root")):  # the forms _as_spatial leaves
        loops = sch.get_loops(block)
        n = sum(int(iv.iter_type) == _REDUCE for iv in sch.get(block).iter_vars)
        if not unit(sch.get(block)) or len(loops) < n or any(_extent(sch, lp) != 1 for lp in loops[len(loops) - n:]):
            continue
        try:
            sch.decompose_reduction(block, loops[len(loops) - n])
            changed = True
        except _REFUSED:
            continue
    return sch.mod["main"] if changed else func


def split_unit_reductions_in(mod: tvm.IRModule) -> tvm.IRModule:
    """split_unit_reductions on every kernel of `mod` (before any scheduler, MetaSchedule's
    tuning and its database lookups included, so that both see the same kernels)."""
    out = mod
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            split = split_unit_reductions(func)
            if not split.same_as(func):
                out = out.clone() if out is mod else out
                out[gv] = split
    return out


def _as_spatial(block: s_tir.SBlock) -> s_tir.SBlock | None:
    """A reduction block over one element as a spatial block: `acc = init; acc = acc op x`
    becomes `acc = init op x`. None where the update is not one such binary op on one buffer
    (an argmax's pair of buffers)."""
    init, body = block.init, block.body
    if not (isinstance(init, tirx.BufferStore) and isinstance(body, tirx.BufferStore)
            and init.buffer.same_as(body.buffer)):
        return None

    def is_acc(e: object) -> bool:
        return isinstance(e, tvm.ir.TensorLoad) and e.source.same_as(body.buffer) and len(e.indices) == len(
            body.indices) and all(tvm_ffi.structural_equal(a, b) for a, b in zip(e.indices, body.indices))

    value = body.value
    if not (hasattr(value, "a") and hasattr(value, "b")) or is_acc(value.a) == is_acc(value.b):
        return None
    value = type(value)(init.value, value.b) if is_acc(value.a) else type(value)(value.a, init.value)
    iters = [tirx.IterVar(iv.dom, iv.var, 0) if int(iv.iter_type) == _REDUCE else iv for iv in block.iter_vars]
    reads = [r for r in block.reads if not r.source.same_as(body.buffer)]
    return s_tir.SBlock(iters, reads, block.writes, block.name_hint, tirx.BufferStore(body.buffer, value, body.indices),
                        None, block.alloc_buffers, block.match_buffers, block.annotations)


def _map_blocks(func: tirx.PrimFunc, fn: Callable[[s_tir.SBlock], s_tir.SBlock]) -> tirx.PrimFunc:
    """`func` with every block but the root replaced by `fn` of it."""
    def apply(stmt: tirx.Stmt, _loops: list) -> tirx.Stmt:
        if not (isinstance(stmt, s_tir.SBlockRealize) and stmt.iter_values):  # the root realises no iterators
            return stmt
        block = fn(stmt.block)
        return stmt if block.same_as(stmt.block) else s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)

    return _map_func(func, apply)


def _map_stmts(stmt: tirx.Stmt, fn: Callable[[tirx.Stmt, list], tirx.Stmt], loops: list) -> tirx.Stmt:
    """`stmt` rebuilt bottom up, each loop, sequence, block realisation and block replaced by
    `fn(node, loops)` once its own statements are (`loops`: the loops around the node, the
    outermost first, after those given); a node is rebuilt only where something below changed.
    TIR's Python API in TVM 0.27 has no statement mutator (ir_transform went with TE)."""
    node = stmt
    if isinstance(stmt, tirx.For):
        body = _map_stmts(stmt.body, fn, [*loops, stmt])
        node = stmt if body.same_as(stmt.body) else _with_body(stmt, body)
    elif isinstance(stmt, tirx.SeqStmt):
        seq = [_map_stmts(x, fn, loops) for x in stmt.seq]
        node = stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    elif isinstance(stmt, s_tir.SBlockRealize):
        block = _map_stmts(stmt.block, fn, loops)
        node = stmt if block.same_as(stmt.block) else s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
    elif isinstance(stmt, s_tir.SBlock):
        body = _map_stmts(stmt.body, fn, loops)
        node = stmt if body.same_as(stmt.body) else s_tir.SBlock(
            stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint, body, stmt.init, stmt.alloc_buffers,
            stmt.match_buffers, stmt.annotations)
    return fn(node, loops)


def _map_func(func: tirx.PrimFunc, fn: Callable[[tirx.Stmt, list], tirx.Stmt]) -> tirx.PrimFunc:
    """`func` with its statements mapped by `_map_stmts`."""
    body = _map_stmts(func.body, fn, [])
    return func if body.same_as(func.body) else func.with_body(body)


def _with_body(loop: tirx.For, body: tirx.Stmt, drop: str | None = None) -> tirx.For:
    """`loop` around `body`, without the annotation `drop`."""
    notes = {k: v for k, v in (loop.annotations or {}).items() if k != drop}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, notes, loop.step)


def _schedule(func: tirx.PrimFunc, lanes: int, tile: bool, acc: int) -> tirx.PrimFunc | None:
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    sch = new_schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    # padding stays a block of its own: inlined, its bounds test sits in the innermost loop of
    # the convolution and defeats vectorisation; materialised, it is one cheap copy. A "pad" of
    # zero width (1x1 convolutions) is a plain copy and is inlined like any elementwise block.
    # A pooling window's padding is inlined: its test depends on the image position only, not
    # on the vectorised channels (SqueezeNet's 3x3 max pool: 11 -> 4.5 us).
    # So is a depthwise convolution's: it reads its input as vectors along the channels too,
    # and the materialised copy doubled the traffic of a kernel that is memory-bound
    # (MobileNetV2-224's, kernels alone: 112x112x96 stride 2 1401 -> 546 us, 56x56x144 966 ->
    # 713 us; all ten of them 1.53x, those of the 64x64 MobileNetV2 2.1x).
    vector_pads = [i for i in infos if _is_padding(sch, i.block_rv) and _read_as_vectors(sch, i.block_rv, 2 * lanes)]
    pads = [i for i in infos if _is_padding(sch, i.block_rv) and _feeds_product(sch, i.block_rv)
            and i not in vector_pads]
    # arithmetic feeding a matmul/conv stays a stage of its own: inlined, it would be recomputed
    # for every output that reads its value (a GELU before a projection: 128 times per element,
    # 5 -> 136 us in BERT); copies, reshapes and transposes inline as index arithmetic
    # so does arithmetic on a small tensor that a larger one reads broadcast (a bias quantized at
    # run time, one value per channel; an attention mask per key): inlined, it would be
    # recomputed for every element of the consumer (ddddocr's int8 CRNN: floor(bias / scale) per
    # output pixel of each convolution: a 32x128x24 one 2.10 -> 0.26 ms, timed alone)
    kept = pads + [i for i in infos if i not in pads and i not in vector_pads and not _is_copy(sch, i.block_rv)
                   and (_feeds_product(sch, i.block_rv) or _read_broadcast(sch, i.block_rv))]
    infos = kept + _try_inline(sch, [i for i in infos if i not in kept])
    anchors: dict[str, s_tir.schedule.LoopRV] = {}
    for info in infos:
        block = info.block_rv
        if info in pads:  # once its consumer has its tiles (_pad_in_tiles)
            continue
        kinds = info.dom_kind()
        loops = sch.get_loops(block)
        if len(kinds) != len(loops):  # an epilogue whose rows _flatten_rows merged since
            kinds = "".join("R" if int(iv.iter_type) == _REDUCE else "S" for iv in sch.get(block).iter_vars)
        if "O" in kinds or not loops or len(kinds) != len(loops):
            continue
        s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
        r_loops = [lp for lp, k in zip(loops, kinds) if k == "R"]
        if r_loops and math.prod(_extent(sch, lp) or 2 for lp in s_loops) == 1:
            _schedule_whole_reduction(sch, block, s_loops + r_loops, lanes)
            continue
        if not s_loops:
            continue
        if not r_loops:
            if _attach_epilogue(sch, block, anchors):
                _vectorize_inner(sch, block, lanes)
                continue
            # an epilogue left out of its reduction's tile (it also reads a stage kept at the
            # root, which TIR's reverse_compute_at refuses) runs over the whole output after it
            detached = any(sch.get(p).name_hint in anchors for p in sch.get_producers(block))
            _schedule_spatial(sch, block, s_loops, lanes, costly=detached or _costly(sch, block))
        else:
            s_vars = [str(it.var) for it, k in zip(info.iters, kinds) if k == "S"]
            par = _schedule_reduction(sch, block, s_loops, r_loops, lanes, tile, s_vars, acc)
            if par is not None:  # decompose_reduction and cache_write add blocks consumers read
                for inside in sch.get_child_blocks(par):
                    anchors[sch.get(inside).name_hint] = par
    for info in pads:
        placed = _pad_in_tiles(sch, info.block_rv, anchors, lanes)
        if placed is not None:
            sch = placed
        else:
            _schedule_spatial(sch, info.block_rv, sch.get_loops(info.block_rv), lanes)
    _tile_buffers_local(sch, anchors)
    return _overlap_last_tile(_insert_prefetches(sch.mod["main"])).with_attr(SCHEDULED_ATTR, True)


PAD_REDUNDANCY = 4.0


def _pad_in_tiles(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, anchors: dict[str, s_tir.schedule.LoopRV], lanes: int
) -> s_tir.Schedule | None:
    """Pad a convolution's input tile by tile, each tile the rows and columns its outputs read,
    rather than into a padded copy of the whole image first. The copy wrote an image-sized
    buffer to memory to read it back (MobileNetV4's 112x112x32 stride-2 3x3 convolution: 40 of
    its 194 us, scripts/pad_cost.py); per tile the padded window is written to and read from
    L1. Neighbouring tiles overlap and pad some elements twice: declined where that would pad
    each element more than PAD_REDUNDANCY times over, or where the window's extent varies from
    tile to tile (tiles across image rows). A copy of the schedule with the pad placed, or
    None."""
    consumers = sch.get_consumers(block)
    loop = anchors.get(sch.get(consumers[0]).name_hint) if len(consumers) == 1 else None
    shape = sch.get(block).writes[0].source.shape
    if loop is None or not all(isinstance(d, tirx.IntImm) for d in shape):
        return None
    trial = sch.copy()
    try:
        trial.compute_at(block, loop)
    except _REFUSED:
        return None
    extents = [_extent(trial, lp) for lp in trial.get_loops(block)]
    if None in extents or math.prod(extents) > PAD_REDUNDANCY * math.prod(int(d) for d in shape):
        return None
    _vectorize_inner(trial, block, lanes)
    return trial


def _try_inline(sch: s_tir.Schedule, infos: list) -> list:
    """DLight's try_inline (inline blocks into their consumers, else their producers into
    them, until none is left that TIR accepts; returns the rest), each inlining bounded by
    MAX_INLINED_CHARS."""
    too_big: set[tuple[str, bool]] = set()  # for good: inlining only ever grows the blocks

    def trial(inline: Callable, reverse: bool) -> int | None:
        for k, info in enumerate(infos):
            key = (sch.get(info.block_rv).name_hint, reverse)
            if key in too_big:
                continue
            if not _inline_fits(sch, info.block_rv, reverse):
                too_big.add(key)
                continue
            try:
                inline(info.block_rv)
            except _REFUSED:
                continue
            return k
        return None

    while True:
        k = trial(sch.compute_inline, False)
        if k is None:
            k = trial(sch.reverse_compute_inline, True)
        if k is None:
            return infos
        infos.pop(k)


def _inline_fits(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, reverse: bool = False) -> bool:
    """Whether inlining `block` (into its consumers; with `reverse`, into its producer) leaves
    every block it joins within MAX_INLINED_CHARS of TIR: each read of the producer's buffer
    in the consumer becomes a copy of the producer's expression. Never a concatenation into a
    reader that reshapes or transposes it."""
    pairs = ([(block, p) for p in sch.get_producers(block)] if reverse
             else [(c, block) for c in sch.get_consumers(block)])
    for consumer_rv, producer_rv in pairs:
        consumer, producer = sch.get(consumer_rv), sch.get(producer_rv)
        # a concatenation read permuted (an LSTM's steps stacked along time, then transposed)
        # stays a loop per input (_schedule_concat): inlined, its reader tested every input's
        # bounds at each element (Sequencer2D's 64-way one: 640 us a call)
        if not _reads_elementwise(sch, consumer_rv, producer_rv):
            concat = _concat_axis(sch, producer_rv, sch.get_loops(producer_rv))
            if concat is not None and len(concat[1]) >= OUTER_CONCAT_INPUTS:
                return False
        if len(producer.writes) != 1:
            continue
        text = _body_text(consumer.body)
        name = re.escape(producer.writes[0].source.name)
        reads = len(re.findall(rf"(?<![\w.]){name}\[", text))
        if reads and len(text) + reads * len(_body_text(producer.body)) > MAX_INLINED_CHARS:
            return False
    return True


def _schedule_whole_reduction(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list, lanes: int) -> None:
    """A reduction of a whole tensor to one value (the min and the max from which
    DynamicQuantizeLinear computes its scale, before each int8 matmul or convolution of an
    onnxruntime `quantize_dynamic` model): partial results of WHOLE_CHUNKS chunks in parallel,
    each a vector of lanes accumulated along the tensor, then combined (ddddocr's int8 CRNN's
    16x64x192 min: 107 -> 4.2 us timed alone; it ran one element at a time on one core)."""
    extents = [_extent(sch, lp) for lp in loops]
    if None in extents or math.prod(extents) < MIN_WHOLE_REDUCTION:
        return
    width = _vector_width(extents[-1], lanes)
    if width is None:
        return
    rows = math.prod(extents[:-1])
    # each vector a run of one row's elements: a vector straddling rows of a fused index reads
    # its lanes one by one (1x32x128x24 in vectors of 16 over the whole: 42 us; of 8 along the
    # rows of 24: 3.9 us, timed alone)
    parts = rows if rows > 1 else extents[-1] // width
    chunks = next((c for c in (WHOLE_CHUNKS, WHOLE_CHUNKS // 2, WHOLE_CHUNKS // 4, 2) if parts % c == 0), None)
    if chunks is None:
        return
    if rows > 1:
        sch.split(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0], [chunks, None])
        _, lane = sch.split(loops[-1], [None, width])
    else:
        _, _, lane = sch.split(sch.fuse(*loops) if len(loops) > 1 else loops[0], [chunks, None, width])
    try:  # a reduction rfactor does not know (an argmax's pair of values) stays a serial loop
        lanes_rf = sch.rfactor(lane, 0)  # partial[lane] over (chunk, step)
        partial = sch.rfactor(sch.get_loops(lanes_rf)[0], 0)  # partial[chunk, lane] over the chunk
    except _REFUSED:
        return
    outer, steps, *_, inner = sch.get_loops(partial)
    sch.parallel(outer)
    sch.vectorize(inner)  # before the init leaves the reduction loop
    sch.decompose_reduction(partial, steps)


def _tile_buffers_local(sch: s_tir.Schedule, anchors: dict[str, s_tir.schedule.LoopRV]) -> None:
    """Buffers written and read only inside one parallel tile (the copy of a register tile's
    accumulator its epilogue reads) in local scope, where the accumulator is local (a tile of
    STACK_BYTES or more, see _tile_scope). TIR shrinks them to the tile either way, but such a
    buffer comes from the runtime's workspace pool; in local scope TIR's storage rewrite gives
    the copy the accumulator's own storage, one allocation instead of two. ResNet-50's 56x56
    1x1 convolution + residual add 1.13x alone, warm and cold (AVX-512's 8x2 tiles)."""
    params = list(sch.mod["main"].params)  # buffers, in TVM 0.27
    for name, par in anchors.items():
        block = sch.get_sblock(name)
        writes = sch.get(block).writes
        if len(writes) != 1:
            continue
        buf = writes[0].source
        if buf.scope() != "global" or any(buf.same_as(p) for p in params):
            continue
        loop = sch.get(par)
        inside = lambda b: any(sch.get(lp).same_as(loop) for lp in sch.get_loops(b))  # noqa: E731
        # only where the tile's accumulator is local itself: global ones are on the stack
        local_input = any(r.source.scope() == "local" for r in sch.get(block).reads)
        if local_input and inside(block) and all(inside(c) for c in sch.get_consumers(block)):
            sch.set_scope(block, 0, "local")


# --- row kernels: reductions and their broadcasts, one row at a time -----------------------------


def _reduces_innermost(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block reduces along the innermost axis of something it reads (a softmax's or
    a layer norm's row), not only across outer ones (a pooling window in channels-last)."""
    blk = sch.get(block)
    r_vars = [iv.var for iv in blk.iter_vars if int(iv.iter_type) == _REDUCE]
    return any(_uses(region.region[-1].min, v) for region in blk.reads for v in r_vars if region.region)


def _is_reduction(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    return any(int(iv.iter_type) == _REDUCE for iv in sch.get(block).iter_vars)


def _reuses_inputs(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """A matmul/conv-like reduction: some output axis is absent from an input it reads, so the
    input is reused across that axis (register tiles pay; one row at a time would not)."""
    blk = sch.get(block)
    if not _is_reduction(sch, block):
        return False
    axes = [str(iv.var) for iv in blk.iter_vars if int(iv.iter_type) == 0 and int(iv.dom.extent) > 1]
    reads = [str(r) for r in blk.reads]
    return any(not _names(r, v) for v in axes for r in reads)


def _driven(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list) -> list[set[int]] | None:
    """For each of `block`'s loops, which of its iterators the loop drives (from the iterator
    bindings: after compute_at, loops no longer follow the iterators' order)."""
    if not loops:
        return []
    body = sch.get(loops[-1]).body
    blk = sch.get(block)
    for stmt in list(body.seq) if hasattr(body, "seq") else [body]:
        if hasattr(stmt, "iter_values") and stmt.block.same_as(blk):
            return [{k for k, value in enumerate(stmt.iter_values) if _uses(value, sch.get(lp).loop_var)}
                    for lp in loops]
    return None


def _reduction_loops(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list) -> list[bool] | None:
    """For each of `block`'s loops, whether a reduction iterator depends on it."""
    driven = _driven(sch, block, loops)
    if driven is None:
        return None
    reduce = {k for k, iv in enumerate(sch.get(block).iter_vars) if int(iv.iter_type) == _REDUCE}
    return [bool(d & reduce) for d in driven]


def _nest_work(sch: s_tir.Schedule) -> int:
    """Iterations of all loop nests: compute_at must not add recomputation."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    return sum(math.prod(_extent(sch, lp) or 1 for lp in sch.get_loops(b)) for b in blocks)


def _schedule_rows(func: tirx.PrimFunc, lanes: int, acc: int) -> tirx.PrimFunc | None:
    """Kernels of reductions over the innermost axis and their neighbours (softmax, layer norm,
    fused chains of them, and the matmuls around them: attention's Q K^T -> softmax -> V, an
    MLP's layers before its softmax): every stage computed one row at a time under one
    (parallel) row loop, so the row stays in L1 between stages; reductions vectorised by
    accumulating a vector of partial results (rfactor) summed pairwise, elementwise stages
    vectorised, matmul-like stages in i-k-j order over a few rows with register accumulators.

    None when the kernel is not of that form (no row reduction: plain GEMMs and convolutions get
    register tiles; several outputs, a reduction over an outer axis, or a row that would
    recompute work)."""
    sch = new_schedule(func)
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    products = [b for b in blocks if _reuses_inputs(sch, b)]
    if not any(_is_reduction(sch, b) and b not in products for b in blocks):
        return None  # no row reduction: GEMMs and convolutions get register tiles instead
    if any(_is_reduction(sch, b) and b not in products and not _reduces_innermost(sch, b) for b in blocks):
        # a window reduction over an image (channels-last pooling: its innermost axis is the
        # channels) is no row: as one, ResNet's 3x3 max pool ran the window outermost, over the
        # whole 16x16x32 output 9 times (63 us, onnxruntime's 15)
        return None
    for b in blocks:
        kinds = _reduction_loops(sch, b, sch.get_loops(b))
        if kinds is None or (any(kinds) and not kinds[-1]):
            return None
    # elementwise stages with one consumer fold into it; one read by several (softmax's exp) is
    # computed once per row instead of once per reader
    for b in blocks[:-1]:
        if (not _is_reduction(sch, b) and not _is_padding(sch, b) and len(sch.get_consumers(b)) == 1
                and _inline_fits(sch, b)):
            try:
                sch.compute_inline(b)
            except _REFUSED:
                pass
    # rfactor needs the reduction in a loop nest of its own: split off the lanes before moving
    # stages into the row
    partials = []
    for b in sch.get_child_blocks(root):
        if not _is_reduction(sch, b) or _reuses_inputs(sch, b) or not sch.get_loops(b):
            continue
        ext = _extent(sch, sch.get_loops(b)[-1])
        for width in (_ragged_width(ext, lanes), _vector_width(ext, lanes)):
            if width is None or ext <= width:
                continue
            trial = sch.copy() if ext % width else sch  # only a ragged split can be declined
            _, lane = trial.split(trial.get_loops(b)[-1], [None, width])
            axis = len(trial.get(b).writes[0].region)
            partial = trial.rfactor(lane, axis)
            if ext % width and not _guard_partial(trial, partial, ext):
                continue  # a ragged reduction of another form: a width that divides it, or one chain
            sch = trial
            partials.append(partial)
            while width >= 4:  # the partials summed pairwise: a tree, not a chain of `width`
                width //= 2
                _, lane = sch.split(sch.get_loops(b)[-1], [2, width])
                partials.append(sch.rfactor(lane, axis))
            break
    blocks = sch.get_child_blocks(root)
    # copies at the end (a reshape of a layer norm that is also an output of the kernel) stay
    # loop nests of their own: their index arithmetic ((j // 128 + i) % 32) hides from
    # compute_at that a row needs one row, and every stage would cover all rows (3.6 us
    # against 0.4 us for BERT's layer norm followed by its reshape)
    tail = []
    while len(blocks) > 1 and _is_copy(sch, blocks[-1]):
        tail.insert(0, blocks.pop())
    sink = blocks[-1]
    if any(not sch.get_consumers(b) for b in blocks[:-1]):
        return None
    work = _nest_work(sch)
    loops = sch.get_loops(sink)
    kinds = _reduction_loops(sch, sink, loops) or [True]
    outer = next((k for k, r in enumerate(kinds) if r), len(loops))
    for depth in range(min(outer, len(loops) - 1), 0, -1):  # the deepest row that adds no work
        trial = sch.copy()
        head = trial.get_loops(sink)[:depth]
        # a tile of rows must not straddle the next outer index (a head's last rows and the
        # next head's first): compute_at would cover both heads whole
        tile = _product_rows(trial, products, _extent(trial, head[-1]), lanes, acc)
        row = trial.fuse(*head) if depth > 1 else head[0]
        if tile > 1:  # several rows at once: independent accumulators hide the FMA latency
            row, _ = trial.split(row, [None, tile])
        try:
            for b in reversed(blocks[:-1]):
                trial.compute_at(b, row, preserve_unit_loops=False)
        except _REFUSED:
            continue
        if _nest_work(trial) <= work * 1.01:
            break
    else:
        return None
    if work >= ROW_PARALLEL_WORK and (_extent(trial, row) or 2) > 1:
        trial.parallel(row)
    tail_names = {trial.get(b).name_hint for b in tail}
    # the blocks themselves, not their handles: peeling a stage's last step replaces its block
    partial_blocks = [trial.get(p) for p in partials]
    for b in trial.get_child_blocks(root):
        blk = trial.get(b)
        if blk.name_hint in tail_names:
            _vectorize_inner(trial, b, lanes)
        else:
            _vectorize_row_stage(trial, b, lanes, any(blk.same_as(p) for p in partial_blocks), acc)
    return trial.mod["main"].with_attr(SCHEDULED_ATTR, True)


def _guard_partial(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, extent: int) -> bool:
    """Make the partial reduction of a ragged row (197 tokens in 16 lanes) add the reduction's
    identity past the row's end, in its value rather than its predicate: compute_at, which
    moves it into the row, rebuilds its loops without the split's predicate and would sum past
    the row. Its reads then name the row itself (the split's index would ask producers for 208
    elements); `likely` lets LoopPartition run every step but the last as whole vectors.
    False where the stage is not of that form (an index other than the split's plus an offset)."""
    from tvm.sym.analyzer import Analyzer

    blk = sch.get(block)
    store = blk.body
    if blk.init is None or not isinstance(store, tirx.BufferStore):
        return False
    lane_var = blk.writes[0].region[-1].min  # rfactor's new axis indexes the partials last
    lanes = next((iv.dom.extent for iv in blk.iter_vars if iv.var.same_as(lane_var)), None)
    steps = [iv.var for iv in blk.iter_vars if int(iv.iter_type) == 2]  # the reduction's iterators
    if lanes is None or len(steps) != 1:
        return False
    step_var = steps[0]
    value = store.value
    if not isinstance(value, (tirx.Add, tirx.Max, tirx.Min)):
        return False
    kept = [isinstance(x, tvm.ir.TensorLoad) and x.source.same_as(store.buffer) for x in (value.a, value.b)]
    if kept.count(True) != 1:
        return False
    index = step_var * lanes + lane_var
    dtype = index.ty.dtype
    reads = []
    for region in blk.reads:
        ranges = []
        for r in region.region:
            if not (_uses(r.min, step_var) or _uses(r.min, lane_var)):
                ranges.append(r)
                continue
            offset = Analyzer().simplify(r.min - index)
            if _uses(offset, step_var) or _uses(offset, lane_var) or not _is_one(r.extent):
                return False
            ranges.append(tvm.ir.Range.from_min_extent(offset, tirx.IntImm(dtype, extent)))
        reads.append(tirx.BufferRegion(region.source, ranges))
    other = value.b if kept[0] else value.a
    guarded = tirx.if_then_else(tirx.likely(index < tirx.IntImm(dtype, extent)), other, blk.init.value)
    value = type(value)(*((value.a, guarded) if kept[0] else (guarded, value.b)))
    _replace_body(sch, block, tirx.BufferStore(store.buffer, value, store.indices), reads)
    return True


def _replace_body(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, body: tirx.Stmt, reads: list | None = None
) -> None:
    """Give `block` a new body (and declared reads), in place: TIR's schedule has no primitive
    for it, and the block keeps its handle (`block`) and its place."""
    blk = sch.get(block)
    new = s_tir.SBlock(blk.iter_vars, blk.reads if reads is None else reads, blk.writes, blk.name_hint, body,
                       blk.init, blk.alloc_buffers, blk.match_buffers, blk.annotations)
    sch.state.replace(sch.get_sref(block), new, {blk: new})


def _product_rows(sch: s_tir.Schedule, products: list, rows: int | None, lanes: int, acc: int) -> int:
    """Rows a row kernel with matmul-like stages computes together: each stage then keeps
    rows x vectors accumulators in registers (one row's single chain of FMAs waits on latency).
    Only exact divisors: compute_at drops a partial tile's predicate."""
    if not products or not rows:
        return 1
    width = 1
    for b in products:
        spatial = [iv for iv in sch.get(b).iter_vars if int(iv.iter_type) == 0]
        width = max(width, -(-int(spatial[-1].dom.extent) // lanes))
    return next((t for t in (4, 2) if rows % t == 0 and t * width <= acc), 1)


def _vectorize_row_stage(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, lanes: int, partial: bool, acc: int
) -> None:
    """Vectorise one stage inside the row loop (the first loop of every stage): elementwise
    stages along their innermost axis (a ragged row's too, see _ragged_width), partial
    reductions along their lanes."""
    loops = sch.get_loops(block)
    kinds = _reduction_loops(sch, block, loops)
    if len(loops) < 2 or kinds is None:
        return
    steps = [lp for lp, r in zip(loops[1:], kinds[1:]) if r]  # reduction loops inside the row
    if partial:  # compute_at made loops in iterator order: the steps go outside the lanes
        blk = sch.get(block)
        lane_var = blk.writes[0].region[-1].min  # rfactor's new axis indexes the partials last
        lane = next(k for k, iv in enumerate(blk.iter_vars) if iv.var.same_as(lane_var))
        driven = _driven(sch, block, loops) or []
        rows = [lp for lp, r, d in zip(loops[1:], kinds[1:], driven[1:]) if not r and lane not in d]
        lanes_loop = [lp for lp, d in zip(loops[1:], driven[1:]) if lane in d]
        sch.reorder(*steps, *rows, *lanes_loop)
        sch.vectorize(lanes_loop[-1])
        sch.decompose_reduction(block, steps[0])
        if "T.likely" in _body_text(blk.body):  # a ragged row's (_guard_partial): its last step apart
            _peel_last_step(sch, steps[0])
        return
    if not any(kinds):
        _reciprocal_divisors(sch, block)
        _vectorize_inner(sch, block, lanes, ragged=True)
    elif not kinds[0]:  # a matmul-like stage: i-k-j within the row, its output row vectorised
        spatial = [lp for lp, r in zip(loops[1:], kinds[1:]) if not r]
        if not spatial:
            return
        sch.reorder(*steps, *spatial)
        _vectorize_inner(sch, block, lanes)  # before the init leaves the reduction loop
        outputs = sch.get_loops(block)[1 + len(steps):-1]
        if math.prod(_extent(sch, lp) or acc for lp in outputs) <= acc:
            for lp in outputs:  # a few rows and vectors of output: accumulators stay in registers
                sch.unroll(lp)
        sch.decompose_reduction(block, steps[0])


def _reciprocal_divisors(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """Rewrite x / s, where s is the same along the row `block` writes (a softmax's sum, a norm),
    as x * (1 / s): LLVM then divides once per row and multiplies each vector, where a vector
    division per element took a fifth of a softmax (4 x 197 x 197: 37 -> 31 us). Two roundings
    where the quotient has one, as onnxruntime's softmax computes it."""
    blk = sch.get(block)
    store = blk.body
    if not isinstance(store, tirx.BufferStore) or not store.indices or not isinstance(store.indices[-1], tirx.Var):
        return
    along = store.indices[-1]

    def rewrite(e: tirx.PrimExpr) -> tirx.PrimExpr:
        if isinstance(e, tirx.Div) and str(e.ty.dtype).startswith("float") and not _uses(e.b, along):
            return rewrite(e.a) * (tirx.FloatImm(str(e.ty.dtype), 1.0) / e.b)
        if isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Max, tirx.Min)):
            a, b = rewrite(e.a), rewrite(e.b)
            return e if a.same_as(e.a) and b.same_as(e.b) else type(e)(a, b)
        return e

    value = rewrite(store.value)
    if not value.same_as(store.value):
        _replace_body(sch, block, tirx.BufferStore(store.buffer, value, store.indices))


def _feeds_product(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether a matmul/conv-like block reads `block`'s output, directly or through copies."""
    return any(_reuses_inputs(sch, c) or (_is_copy(sch, c) and _feeds_product(sch, c))
               for c in sch.get_consumers(block))


def _read_broadcast(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether a block with at least BROADCAST_REUSE times `block`'s iterations reads its output,
    directly or through copies (each of its values then read by many of the consumer's), and
    `block` with the stages that inline into it is costly per element. A cheap one (MobileNetV3's
    hard sigmoid: a multiply, an add, a clip) is left to inline: kept, it also keeps the
    consumer out of its convolution's tile (see _schedule), a pass over the output that cost
    more than the recomputation (6 of its kernels 59 -> 65 us, a one-off A/B)."""
    if _is_reduction(sch, block) or not _costly(sch, block):
        return False
    size = _domain(sch.get(block))
    pending = list(sch.get_consumers(block))
    while pending:
        consumer = pending.pop()
        if _domain(sch.get(consumer)) >= size * BROADCAST_REUSE:
            return True
        if _is_copy(sch, consumer):
            pending.extend(sch.get_consumers(consumer))
    return False


# what makes an element costly to recompute: a division, exp/log and their kin, rounding, the
# non-finite tests of a float -> int cast (the printed TIR names them)
_COSTLY = (" / ", "T.exp", "T.log", "T.sqrt", "T.rsqrt", "T.tanh", "T.erf", "T.pow", "T.floor", "T.nearbyint",
           "T.isnan", "T.sigmoid")


def _costly(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether `block` or a producer of the same size (which inlines into it) computes one of
    _COSTLY."""
    size = _domain(sch.get(block))
    pending, seen = [block], set()
    while pending:
        b = pending.pop()
        blk = sch.get(b)
        if blk.name_hint in seen:
            continue
        seen.add(blk.name_hint)
        if _computes_costly(blk.body):
            return True
        pending.extend(p for p in sch.get_producers(b) if not _is_reduction(sch, p) and _domain(sch.get(p)) == size)
    return False


def _computes_costly(body: tirx.Stmt) -> bool:
    """Whether a block body names one of _COSTLY."""
    text = _body_text(body)
    return any(op in text for op in _COSTLY)


class _BodyTexts:
    """Block bodies as printed TIR. Printing is slow and the same bodies are read again for
    every block whose producers or consumers they are, so each text is kept by the body's
    structural hash, up to `limit` characters in all (then all forgotten)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.texts: dict[int, str] = {}
        self.chars = 0

    def __call__(self, body: tirx.Stmt) -> str:
        key = tvm_ffi.structural_hash(body)
        if key not in self.texts:
            if self.chars >= self.limit:
                self.texts, self.chars = {}, 0
            self.texts[key] = str(body)
            self.chars += len(self.texts[key])
        return self.texts[key]


_body_text = _BodyTexts(1 << 24)


def _domain(blk: object) -> int:
    """A block's iteration count from its own iterators: unlike _work (its loops' product), the
    same wherever the schedule has placed it (a tile's copy-out block under the tile's loops)."""
    return math.prod(int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else MIN_PARALLEL_WORK
                     for iv in blk.iter_vars)


def _read_as_vectors(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, tile: int) -> bool:
    """Whether every consumer of `block` is a matmul/conv-like block reading its output along
    the consumer's own innermost output axis (a depthwise convolution's channels), rather than
    one value for a whole row of outputs (a convolution's input channel). A grouped
    convolution reads input channel g * c_in + rc for output channel j in group g = j // c_out:
    one value for a `tile` of outputs (two vectors) where c_out is a multiple of it, as an
    ordinary convolution reads (ResNeSt's 2-group 3x3 ones: 160 GFLOP/s with their padding
    inlined, 320 with it materialised; groups of 16 channels, materialised, ran 1.3x slower)."""
    consumers = sch.get_consumers(block)
    written = [w.source for w in sch.get(block).writes]
    for c in consumers:
        blk = sch.get(c)
        spatial = [iv for iv in blk.iter_vars if int(iv.iter_type) != _REDUCE]
        if not spatial or not _reuses_inputs(sch, c):
            return False
        j, extent = spatial[-1].var, spatial[-1].dom.extent
        regions = [r for r in blk.reads if any(r.source.same_as(w) for w in written)]
        if not regions or not all(r.region and _uses(r.region[-1].min, j) for r in regions):
            return False
        if isinstance(extent, tirx.IntImm) and int(extent) % tile == 0 and all(
                _same_for_lanes(r.region[-1].min, j, tile, int(extent) // tile) for r in regions):
            return False
    return bool(consumers)


def _same_for_lanes(index: object, jv: tirx.Var, width: int, blocks: int) -> bool:
    """Whether `index` is one value for `width` aligned values of `jv`."""
    from tvm.sym.analyzer import Analyzer

    (split,), lane = _by_lanes([index], jv, width, blocks, Analyzer())
    return not _uses(split, lane)


def _is_copy(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """A block that only moves data (reshape, transpose): its value is one buffer load."""
    body = sch.get(block).body
    value = getattr(body, "value", None)
    while isinstance(value, tirx.Cast):
        value = value.value
    return isinstance(body, tirx.BufferStore) and isinstance(value, tvm.ir.TensorLoad)  # TVM 0.27's BufferLoad


def _is_padding(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """A block that selects between its input and a constant by a bounds test (topi's pad).
    (TVM 0.27 has no Python visitor for TIR statements; the printed body names the call.)"""
    return "if_then_else" in str(sch.get(block).body)


def _attach_epilogue(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, anchors: dict[str, s_tir.schedule.LoopRV]
) -> bool:
    # an elementwise consumer of a scheduled reduction: compute it per outer iteration of the
    # reduction, while that slice of the intermediate is still in cache
    for producer in sch.get_producers(block):
        name = sch.get(producer).name_hint
        if name in anchors:
            if not _reads_elementwise(sch, block, producer):
                return False
            try:
                sch.reverse_compute_at(block, anchors[name])
                return True
            except _REFUSED:
                return False
    return False


def _reads_elementwise(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, producer: s_tir.schedule.SBlockRV
) -> bool:
    """Whether `block` reads `producer`'s output one element at a time at plain iterators. An
    epilogue that permutes it (Swin's window reverse: reshape, transpose, reshape inlined after
    a matmul) reads rows other tiles compute, and TIR's reverse_compute_at then places it inside
    the tile anyway (wrong results, seen on Swin): such an epilogue stays a nest of its own,
    whether or not the axes it swaps have equal extents (a stack of an LSTM's steps, [16, 2, 16,
    96], read as [16, 16, 2, 96]). So does one that writes more than it reads of `producer` (a
    concatenation of its output and another tensor): placed in the tile, it would write only the
    part the tile covers, the other inputs' never (YOLOv8's convolution -> SiLU -> concat, fused:
    garbage channels)."""
    written = [w.source for w in sch.get(producer).writes]
    iters = [iv.var for iv in sch.get(block).iter_vars]
    extents = [iv.dom.extent for iv in sch.get(block).iter_vars]
    for region in sch.get(block).reads:
        if any(region.source.same_as(w) for w in written):
            last = -1  # the position among the block's iterators of the last axis read
            for rng, dim in zip(region.region, region.source.shape):
                one = isinstance(rng.extent, tirx.IntImm) and int(rng.extent) == 1
                unit_axis = isinstance(dim, tirx.IntImm) and int(dim) == 1  # batch 1: any index
                if not one or not (isinstance(rng.min, tirx.Var) or unit_axis):
                    return False
                at = next((k for k, v in enumerate(iters) if v.same_as(rng.min)), None)
                if at is not None and at < last:
                    return False  # the axes read in another order: a transpose
                last = last if at is None else at
                extent = None if at is None else extents[at]
                if not unit_axis and not (isinstance(extent, tirx.IntImm) and isinstance(dim, tirx.IntImm)
                                          and int(extent) == int(dim)):
                    return False  # the iterator runs past the producer's axis: a concatenation
    return True


@tvm.transform.module_pass(opt_level=0, name="AutofuseScheduleCPU")
class ScheduleCPU:
    """Schedule every PrimFunc not yet scheduled (after FuseTIR, before lowering to the VM).

    Weights passed as constants are re-laid in the order the kernels read them (see
    `_pack_weights`): with `prepack` (the default) the constants are re-laid here, so the module
    is ready to lower; with `prepack=False` the kernels expect re-laid weights and the caller
    runs `pack_constants` before lowering (build.py keeps the module in that state, where a
    kernel can still be swapped for another schedule of it).

    Args:
        vector_bits: the target CPU's SIMD width (see `vector_bits`).
        prepack: re-lay the constants now.
    """

    def __init__(self, vector_bits: int = 256, prepack: bool = True) -> None:
        self.vector_bits = vector_bits
        self.prepack = prepack

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in unscheduled_kernels(mod).items():
            try:
                scheduled = schedule_cpu(func, vector_lanes(func, self.vector_bits), accumulators(self.vector_bits))
            except Exception:  # a kernel the rule cannot handle stays as it is: correct, slow
                scheduled = None
            if scheduled is not None:
                updates[gv] = scheduled
        if not updates:
            return mod
        out = mod.clone()  # a pass must not change its input
        for gv, func in updates.items():
            out[gv] = func
        return pack_constants(out) if self.prepack else out


def static_buffers(func: tirx.PrimFunc) -> bool:
    """Every parameter a buffer of constant shape. Kernels after a detector's NonMaxSuppression
    also take sizes known only at run time: the rules here schedule them a chunk of rows at a
    time where they can (run_time_rows), and they cannot be run alone on buffers made up for
    them."""
    return all(isinstance(p.ty, tirx.BufferType) and all(isinstance(d, tirx.IntImm) for d in p.shape)
               for p in func.params)


def unscheduled_kernels(mod: tvm.IRModule) -> dict[tvm.ir.GlobalVar, tirx.PrimFunc]:
    """The module's PrimFuncs not yet scheduled, each marked with the parameters its callers
    pass constants at every call (LAYOUT_FREE_ATTR: what `_pack_weights` may re-lay), and
    whether each constant comes at several calls (REUSED_ATTR)."""
    from autofuse.tvm_bridge import constant_params

    constants = constant_params(mod)
    out = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and SCHEDULED_ATTR not in (func.attrs or {}):
            if gv.name_hint in constants:
                free, reused = constants[gv.name_hint]
                func = func.with_attr(LAYOUT_FREE_ATTR, free)
                func = func.with_attr(REUSED_ATTR, True) if reused else func
            out[gv] = func
    return out


def pack_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """Re-lay the constant weights passed to kernels whose schedule re-laid their parameters
    (PACKED_ATTR), once, here: nothing is re-laid at run time. The kernels lose the mark, so a
    second call leaves the module as it is."""
    from autofuse.tvm_bridge import repack_constants

    packed = {gv.name_hint: [(int(k), int(t)) for k, t in f.attrs[PACKED_ATTR]]
              for gv, f in mod.functions.items()
              if isinstance(f, tirx.PrimFunc) and f.attrs and PACKED_ATTR in f.attrs}
    if not packed:
        return mod
    out = repack_constants(mod, packed, pack_array)
    for name in packed:
        out[name] = out[name].without_attr(PACKED_ATTR)
    return out
