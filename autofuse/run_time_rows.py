"""Kernels over a run-time number of rows, scheduled as a loop over chunks of rows of static size.

After a detector's NonMaxSuppression the number of boxes is known only at run time, and so is
the row count of every kernel of the head that follows: Faster R-CNN's box head multiplies
[min(150, proposals), 12544] by [12544, 1024]. The rules in schedule.py read static extents, so
such a kernel stayed a plain loop nest (14.8 s of the model's 15.1 s). Where each row of the
outputs depends only on the same row of the inputs, the kernel is the same static kernel run on
successive chunks of rows: this module schedules that kernel for CHUNK_ROWS rows (and for
SMALL_ROWS) with the rules and loops it over the rows, each chunk's buffers a view at its first
row: whole chunks of CHUNK_ROWS, then the rest in chunks of SMALL_ROWS, the last of which starts at
n - SMALL_ROWS, overlapping the one before it (rows computed twice write the same values); fewer
rows than the smallest chunk go through a padded copy. Where SMALL_ROWS has no schedule of its own
(not one re-laying the weights alike), CHUNK_ROWS chunks alone, the last overlapping.

Only a kernel whose one run-time size is a whole axis of its buffers (after unit axes), indexed
by a row iterator that nothing else reads, qualifies: reductions over the rows, gathers across
them, or values computed from the row number (an arange) keep the plain loop nest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Iterator

from tvm import relax
from tvm import s_tir
from tvm import tirx
from tvm.sym import Analyzer
from tvm.sym import ConstIntBound

from autofuse.schedule import _is_one
from autofuse.schedule import only_indexes

CHUNK_ROWS = 64
SMALL_ROWS = 8


def sizes_analyzer(expr: tirx.PrimExpr) -> Analyzer:
    """TVM's arithmetic analyzer, told that the variables of `expr` are sizes (none below 0)."""
    analyzer = Analyzer()
    for v in tirx.analysis.undefined_vars(expr):
        analyzer.update(v, ConstIntBound(0, 1 << 62))
    return analyzer


class Rows:
    """A kernel's run-time row count n (an expression of sizes known at run time: min(150, s)),
    the axis it sizes in each of its parameters that has it, and the parameters that are sizes
    (passed as scalars) rather than buffers."""

    def __init__(self, func: tirx.PrimFunc, n: tirx.Expr, axes: dict[int, int]) -> None:
        self.func, self.n, self.axes = func, n, axes
        self.sizes = {v.name for v in tirx.analysis.undefined_vars(n)}
        self.analyzer = sizes_analyzer(n)
        self.buffers = [k for k, p in enumerate(func.params) if isinstance(p.ty, tirx.BufferType)]

    @functools.cached_property
    def blocks(self) -> list[s_tir.SBlock]:
        """Every block of the kernel but its root, nested ones too."""
        from autofuse.schedule import new_schedule

        sch = new_schedule(self.func)
        todo, out = list(sch.get_child_blocks(sch.get_sblock("root"))), []
        while todo:
            block = todo.pop()
            todo.extend(sch.get_child_blocks(block))
            out.append(sch.get(block))
        return out

    @functools.cached_property
    def written(self) -> list[tirx.Var]:
        """The buffers some block writes (the kernel's outputs among them)."""
        return [r.source for blk in self.blocks for r in blk.writes]

    def is_n(self, extent: object) -> bool:
        return not isinstance(extent, tirx.IntImm) and self.analyzer.can_prove_equal(extent, self.n)

    def axis(self, buffer: tirx.Var) -> int | None:
        """The axis of `buffer` n sizes, if any."""
        return next((d for d, e in enumerate(buffer.shape) if self.is_n(e)), None)


def row_axes(func: tirx.PrimFunc) -> Rows | None:
    """The kernel's rows: None unless one run-time size n is a whole axis of each parameter
    with a run-time size, the axes before it of extent 1, and the other parameters are static
    buffers or the sizes n is made of."""
    found: Rows | None = None
    for k, p in enumerate(func.params):
        if not isinstance(p.ty, tirx.BufferType):
            continue
        dims = [d for d, e in enumerate(p.shape) if not isinstance(e, tirx.IntImm)]
        if not dims:
            continue
        if len(dims) > 1 or any(int(e) != 1 for e in p.shape[:dims[0]]):
            return None
        if found is None:
            found = Rows(func, p.shape[dims[0]], {})
        if not found.is_n(p.shape[dims[0]]):
            return None
        found.axes[k] = dims[0]
    scalars = {p.name for p in func.params if not isinstance(p.ty, tirx.BufferType)}
    return found if found is not None and scalars <= found.sizes else None


def rows_independent(rows: Rows) -> bool:
    """Whether every row of the outputs is computed from the same row of the inputs alone: in each
    block, an iterator over n is spatial and indexes exactly the n-sized axis of each buffer it
    touches, every buffer it writes has that axis, and the body reads it nowhere else."""
    return all(_block_rows_independent(blk, rows) for blk in rows.blocks)


def _block_rows_independent(blk: s_tir.SBlock, rows: Rows) -> bool:
    row_vars = []
    for iv in blk.iter_vars:
        if rows.is_n(iv.dom.extent):
            if int(iv.iter_type) != 0:
                return False  # a reduction over the rows
            row_vars.append(iv.var)
        elif not isinstance(iv.dom.extent, tirx.IntImm) or not isinstance(iv.dom.min, tirx.IntImm):
            return False
    writes = {r.source.name for r in blk.writes}
    places: dict[str, int] = {}
    for region in list(blk.reads) + list(blk.writes):
        row_dim = rows.axis(region.source)
        for d, rng in enumerate(region.region):
            if d == row_dim and (not _is_one(rng.extent) or not any(rng.min.same_as(v) for v in row_vars)):
                return False
        if row_dim is None and row_vars and region.source.name in writes:
            return False  # every row writing the same place
        if row_dim is not None:
            places[region.source.name] = row_dim
    texts = [str(blk.body)] + ([str(blk.init)] if blk.init is not None else [])
    return all(only_indexes(t, str(v.name), places) for t in texts for v in row_vars)


def chunked_candidates(
    func: tirx.PrimFunc, static_candidates: Callable[[tirx.PrimFunc], Iterator[tirx.PrimFunc]]
) -> Iterator[tirx.PrimFunc]:
    """Schedules of `func` over its run-time rows, best first: for each schedule that
    `static_candidates` makes of CHUNK_ROWS rows (fewer where n is never that many), that
    schedule looped over the rows (see the module's docstring). Nothing when the kernel does not
    qualify."""
    from autofuse.schedule import PACKED_ATTR
    from autofuse.schedule import SCHEDULED_ATTR

    rows = row_axes(func)
    if rows is None or relax.analysis.has_reshape_pattern(func) or not rows_independent(rows):
        return  # a reshape stays as it is: the VM makes it a view of its input, no kernel at all
    counts = _row_counts(rows, max(CHUNK_ROWS, SMALL_ROWS))
    big_rows, size = _chunk_rows(rows, counts, CHUNK_ROWS)
    chunk = _at_rows(rows, big_rows, size)
    small_rows, small_size = _chunk_rows(rows, counts, SMALL_ROWS)
    small = _at_rows(rows, small_rows, small_size) if small_rows < big_rows else None
    small = next(static_candidates(small), None) if small is not None else None
    n = rows.n
    for big in static_candidates(chunk) if chunk is not None else ():
        packed = _packed(rows, big)
        params = list(func.params)
        for j, k in enumerate(rows.buffers):
            if k not in rows.axes:
                params[k] = big.params[j]  # a weight the schedule re-laid takes its new shape
        # each use of a kernel's body gets variables of its own (s_tir.renew_defs): TIR defines
        # a buffer once
        if small is None or _packed(rows, small) != packed:  # big chunks alone, the last overlapping
            looped, (count, last) = _looped(big_rows, s_tir.renew_defs(big), params, rows), (big_rows, big)
        else:  # whole big chunks, then the rest in small ones (an overlapping big one recomputed up to 63 rows)
            whole = tirx.floordiv(n, big_rows)
            looped = tirx.SeqStmt([_looped(big_rows, s_tir.renew_defs(big), params, rows, chunks=whole),
                                   _looped(SMALL_ROWS, s_tir.renew_defs(small), params, rows, whole * big_rows)])
            count, last = SMALL_ROWS, small
        padded = _padded(count, s_tir.renew_defs(last), params, rows)  # fewer rows than the smallest chunk
        body = tirx.IfThenElse(n >= count, looped, tirx.IfThenElse(n > 0, padded, None))
        root = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", body))  # as TVM's analyses expect
        out = tirx.PrimFunc(params, root, attrs=func.attrs).with_attr(SCHEDULED_ATTR, True)
        yield out.with_attr(PACKED_ATTR, packed) if packed else out


def _row_counts(rows: Rows, values: int) -> dict[int, int]:
    """rows n -> the smallest value of the kernel's one scalar size giving them, over the values
    1..`values` of that size; empty where n is not computed from one scalar."""
    scalars = [p for p in rows.func.params if not isinstance(p.ty, tirx.BufferType)]
    counts: dict[int, int] = {}
    if len(scalars) != 1:
        return counts
    size = scalars[0]
    for value in range(1, values + 1):
        at = Analyzer()
        at.bind(size, tirx.IntImm(size.ty.dtype, value))
        count = at.simplify(rows.n)
        if isinstance(count, tirx.IntImm) and int(count) > 0:
            counts.setdefault(int(count), value)
    return counts


def _chunk_rows(rows: Rows, counts: dict[int, int], limit: int) -> tuple[int, int | None]:
    """(rows of a chunk, the value of the size n is computed from that gives it, None where n is
    the rows themselves): as many rows as n can be up to `limit` (Keypoint R-CNN's head runs on
    min(20, detections) rows: 20), or where n is never so few, the fewest it can be (Mask
    R-CNN's upsampling matmul runs on min(20, detections) * 196 rows: one detection's 196).
    `counts`: _row_counts over at least `limit` values, of which the first `limit` count."""
    counts = {c: v for c, v in counts.items() if v <= limit}
    if not counts:
        return min(limit, rows.analyzer.const_int_bound(rows.n).max_value), None
    within = [c for c in counts if c <= limit]
    count = max(within) if within else min(counts)
    return count, counts[count]


def _at_rows(rows: Rows, count: int, size: int | None = None) -> tirx.PrimFunc | None:
    """The kernel with n fixed at `count`, its parameters the kernel's buffers in order (the size
    passed as a scalar fixed at `size`, default `count`, and gone), or None where n cannot be
    fixed at `count` (min(50, s) is never 64)."""
    from autofuse.schedule import LAYOUT_FREE_ATTR
    from autofuse.schedule import static_buffers

    func, scalars = rows.func, [p for p in rows.func.params if not isinstance(p.ty, tirx.BufferType)]
    if scalars:
        if len(scalars) > 1:
            return None
        fixed = func.specialize({scalars[0]: tirx.IntImm(scalars[0].ty.dtype, count if size is None else size)})
    elif isinstance(rows.n, tirx.Var):
        fixed = func.specialize({func.params[k]: _static(func.params[k], d, count) for k, d in rows.axes.items()})
    else:
        return None
    if not static_buffers(fixed) or any(int(fixed.params[rows.buffers.index(k)].shape[d]) != count
                                        for k, d in rows.axes.items()):
        return None
    free = (func.attrs or {}).get(LAYOUT_FREE_ATTR)  # indices among all parameters: now among the buffers
    return fixed.with_attr(LAYOUT_FREE_ATTR, [rows.buffers.index(int(k)) for k in free]) if free else fixed


def _packed(rows: Rows, kernel: tirx.PrimFunc) -> list[list[int]]:
    """The weights `kernel` re-laid (PACKED_ATTR), as [index among all parameters, tile]."""
    from autofuse.schedule import PACKED_ATTR

    return [[rows.buffers[int(j)], int(t)] for j, t in (kernel.attrs or {}).get(PACKED_ATTR, [])]


def _static(p: tirx.Var, axis: int, count: int) -> tirx.Var:
    shape = list(p.shape)
    shape[axis] = tirx.IntImm(shape[axis].ty.dtype, count)
    return tirx.decl_buffer(shape, p.dtype, p.name)


def _looped(
    count: int, kernel: tirx.PrimFunc, params: list, rows: Rows, first: object = 0, chunks: object = None
) -> tirx.Stmt:
    """`kernel` (of `count` rows, n >= count) run on `chunks` chunks of the rows from row `first`
    on (None: as many as reach row n), none past row n: the last one ends there, overlapping the
    rows before it where they do not divide evenly."""
    n = rows.n
    dtype = n.ty.dtype
    chunk = tirx.Var("chunk", dtype)
    start = tirx.min(first + chunk * count, n - count)
    if chunks is None:
        chunks = tirx.floordiv(n - first + (count - 1), count)
    body = _body(kernel, params, rows)
    for k, d in rows.axes.items():
        at = [tirx.IntImm(dtype, 0)] * len(params[k].shape)
        at[d] = start
        body = tirx.DeclBuffer(kernel.params[rows.buffers.index(k)], body, data=tirx.address_of(params[k][tuple(at)]))
    return tirx.For(chunk, tirx.IntImm(dtype, 0), chunks, tirx.ForKind.SERIAL, body)


def _padded(count: int, kernel: tirx.PrimFunc, params: list, rows: Rows) -> tirx.Stmt:
    """`kernel` (of `count` rows) run once on copies of the inputs' 0 < n < count rows, padded
    with copies of their last row (data the kernel is made for: an index in range, say), its
    outputs' first n rows copied back."""
    n = rows.n
    before, after = [], []
    for k, d in rows.axes.items():
        scratch, real = kernel.params[rows.buffers.index(k)], params[k]
        if any(w.same_as(real) for w in rows.written):
            after.append(_copy(real, d, n, lambda idx, s=scratch: s[tuple(idx)]))
        else:
            last = lambda idx, d=d: [tirx.min(i, n - 1) if a == d else i for a, i in enumerate(idx)]  # noqa: E731
            before.append(_copy(scratch, d, scratch.shape[d], lambda idx, r=real, at=last: r[tuple(at(idx))]))
    body = tirx.SeqStmt(before + [_body(kernel, params, rows)] + after)
    for k in rows.axes:
        body = tirx.AllocBuffer(kernel.params[rows.buffers.index(k)], body)
    return body


def _body(kernel: tirx.PrimFunc, params: list, rows: Rows) -> tirx.Stmt:
    """`kernel`'s body reading the static parameters of the function it goes in (a weight the
    schedule re-laid is a parameter of its own in each schedule: declared on the one passed)."""
    body = kernel.body
    for j, p in enumerate(kernel.params):
        k = rows.buffers[j]
        if k not in rows.axes and not p.same_as(params[k]):
            body = tirx.DeclBuffer(p, body, data=tirx.buffer_data(params[k]))
    return body


def _copy(dst: tirx.Var, axis: int, rows: object, value: Callable[[list], object]) -> tirx.Stmt:
    """A loop nest storing value(index) into `dst`'s first `rows` rows (along `axis`)."""
    dtype = dst.shape[axis].ty.dtype
    idx = [tirx.Var(f"i{d}", dtype) for d in range(len(dst.shape))]
    body: tirx.Stmt = tirx.BufferStore(dst, value(idx), idx)
    for d in reversed(range(len(dst.shape))):
        body = tirx.For(idx[d], tirx.IntImm(dtype, 0), rows if d == axis else dst.shape[d], tirx.ForKind.SERIAL, body)
    return body
