"""Kernels over a run-time number of rows (run_time_rows): scheduled a chunk of rows at a time where
each output row depends on the same input row alone, left as plain loops where not.

A detector's box head runs over the boxes its NonMaxSuppression kept; as plain loops Faster
R-CNN's [min(150, n), 12544] x [12544, 1024] matmul took 14.8 s.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm import tirx

from autofuse import build
from autofuse import run_time_rows
from autofuse.schedule import SCHEDULED_ATTR
from autofuse.schedule import schedule_candidates
from autofuse.schedule import static_buffers

# n = 0; fewer rows than the small chunk (padded); between the chunks; exactly a chunk; more
# than a chunk, not a multiple of it (the last chunk overlaps the one before), a few rows more,
# two chunks
ROWS = (0, 3, 8, 13, run_time_rows.CHUNK_ROWS, 67, 100, 128, 150)


def _fused(make: object, width: int | tuple[int, ...], dtype: str = "float32") -> tvm.IRModule:
    """A module whose main maps x: [n, width] (or [n, *width]) to make(bb, x), legalized and
    fused as TVM does."""
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, *width] if isinstance(width, tuple) else [n, width], dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make(bb, x))
        bb.emit_func_output(out)
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
              relax.transform.FuseTIR()]
    return tvm.transform.Sequential(passes)(bb.get())


def _compiled(fused: tvm.IRModule) -> tuple[object, tvm.IRModule]:
    target = build.make_target("llvm")
    return build.compile_repairing(fused, build.schedule(fused, target, "rules"), target)


def _kernels(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


def test_a_matmul_over_run_time_rows_is_chunked_and_matches_numpy_for_any_row_count():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 96)).astype("float32")
    bias = rng.standard_normal(96).astype("float32")
    fused = _fused(lambda bb, x: relax.op.nn.relu(relax.op.add(relax.op.matmul(x, relax.const(w)),
                                                               relax.const(bias))), 256)
    ex, compiled = _compiled(fused)
    (name, kernel), = ((k, f) for k, f in _kernels(compiled).items() if not static_buffers(f))
    text = kernel.script()
    assert kernel.attrs[SCHEDULED_ATTR] and "chunk" in text and "T.parallel" in text, name
    for rows in (run_time_rows.CHUNK_ROWS, run_time_rows.SMALL_ROWS):
        assert f"T.decl_buffer((T.int64({rows})," in text  # both chunk sizes used
    dev = build.device_for(build.make_target("llvm"))
    for n in ROWS:
        x = rng.standard_normal((n, 256)).astype("float32")
        got, = build.run(ex, dev, [x])
        np.testing.assert_allclose(got, np.maximum(x @ w + bias, 0), rtol=1e-4, atol=1e-4)


def test_rows_counted_by_an_expression_of_a_size_passed_as_a_scalar():
    """Faster R-CNN's box head runs over min(150, s) proposals: the kernel takes s as a scalar
    and its buffers are sized by the expression, which is fixed at each chunk's row count."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 32)).astype("float32")
    fused = _fused(lambda bb, x: relax.op.nn.relu(relax.op.matmul(
        relax.op.strided_slice(x, axes=[0], begin=[0], end=[100]), relax.const(w))), 64)
    ex, compiled = _compiled(fused)
    kernels = [f for f in _kernels(compiled).values() if not static_buffers(f)]
    assert any("chunk" in f.script() and any(not isinstance(p.ty, tirx.BufferType) for p in f.params)
               for f in kernels)
    dev = build.device_for(build.make_target("llvm"))
    for n in ROWS + (99, 100, 101):
        x = rng.standard_normal((n, 64)).astype("float32")
        got, = build.run(ex, dev, [x])
        np.testing.assert_allclose(got, np.maximum(x[:100] @ w, 0), rtol=1e-4, atol=1e-4)


def _sum_rows(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    return relax.op.sum(x, axis=0, keepdims=True)  # a reduction over the rows


def _row_numbers(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    rows = bb.emit(relax.op.arange(x.ty.shape[0], dtype="float32"))
    return relax.op.add(x, relax.op.expand_dims(rows, 1))  # each row's value depends on its number


def _reversed_rows(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    return relax.op.flip(x, axis=0)  # row i reads row n - 1 - i


@pytest.mark.parametrize("make, want", [
    (_sum_rows, lambda x: x.sum(0, keepdims=True)),
    (_row_numbers, lambda x: x + np.arange(x.shape[0], dtype="float32")[:, None]),
    (_reversed_rows, lambda x: x[::-1]),
])
def test_kernels_reading_across_rows_or_their_numbers_keep_their_loops_and_their_values(make, want):
    fused = _fused(make, 8)
    for kernel in (f for f in _kernels(fused).values() if not static_buffers(f)):
        assert next(schedule_candidates(kernel, 16, 16), None) is None, kernel.script()
    ex, _ = _compiled(fused)
    dev = build.device_for(build.make_target("llvm"))
    for n in (1, 13, 150):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype("float32")
        got, = build.run(ex, dev, [x])
        np.testing.assert_allclose(got, want(x), rtol=1e-5, atol=1e-5)


def test_a_reshape_over_run_time_rows_is_left_for_the_vm_to_make_a_view():
    """A kernel that only reshapes (SSDlite's 90 per-class [n] -> [n, 1]) becomes a view of its
    input in TVM's VM, no kernel at all: scheduled, it ran as a copy 90 times a run."""
    (kernel,) = _kernels(_fused(lambda bb, x: relax.op.expand_dims(x, 1), 8)).values()
    assert relax.analysis.has_reshape_pattern(kernel)
    assert next(schedule_candidates(kernel, 16, 16), None) is None


def test_kernels_built_beside_a_shape_function_keep_their_pointers_unaliased():
    """With run-time sizes the VM adds shape functions, which TVM does not mark noalias; its LLVM
    codegen gives every function the flag of the last one by symbol, so a model whose kernel
    names all sort before "shape_func" lost it everywhere (RoiAlign over 64 boxes: 4.5 -> 23.6
    ms, loads LLVM had hoisted out of loops made again). build marks functions of one pointer."""
    fused = _fused(lambda bb, x: relax.op.nn.relu(relax.op.matmul(x, relax.const(np.ones((16, 8), "float32")))), 16)
    ex, compiled = _compiled(fused)
    (name,) = (k for k, f in _kernels(compiled).items() if not static_buffers(f))
    assert name < "shape_func", name
    llvm_ir = ex.mod.imports[0].inspect_source("ll")
    compute = re.search(rf"^define [^\n]*@{name}_compute_\(([^\n]*)\)", llvm_ir, re.M)
    assert compute is not None, name
    pointers = re.findall(r"ptr( noalias)?", compute.group(1))  # x, the weights, the output
    assert len(pointers) == 3 and all(pointers), compute.group(1)


def test_a_convolution_over_at_most_20_run_time_images_is_chunked_by_20_and_8():
    """Keypoint R-CNN's head: eight 3x3 convolutions over min(20, detections) images. Chunks of
    64 images never fit n; as plain loops the head took 80 s of the model's 82."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 3, 8, 16)).astype("float32")

    def head(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
        first = bb.emit(relax.op.strided_slice(x, axes=[0], begin=[0], end=[20]))
        return relax.op.nn.relu(relax.op.nn.conv2d(first, relax.const(w), padding=1, data_layout="NHWC",
                                                   kernel_layout="HWIO"))

    ex, compiled = _compiled(_fused(head, (6, 6, 8)))
    (kernel,) = (f for f in _kernels(compiled).values() if not static_buffers(f) and "conv" in f.script())
    text = kernel.script()
    assert "chunk" in text and "T.parallel" in text
    for rows in (20, run_time_rows.SMALL_ROWS):
        assert f"T.decl_buffer((T.int64({rows}), T.int64(6), T.int64(6), T.int64(8))" in text
    dev = build.device_for(build.make_target("llvm"))
    for count in (0, 3, 8, 13, 20, 27):
        images = rng.standard_normal((count, 6, 6, 8)).astype("float32")
        got, = build.run(ex, dev, [images])
        padded = np.pad(images[:20], ((0, 0), (1, 1), (1, 1), (0, 0)))
        want = sum(padded[:, i:i + 6, j:j + 6, :] @ w[i, j] for i in range(3) for j in range(3))
        np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


def test_rows_never_as_few_as_a_chunk_are_chunked_by_the_fewest_they_can_be():
    """Mask R-CNN's 2x2 stride-2 transposed convolution is a matmul over min(20, detections) * 196
    rows: a chunk of 64 (or 8) rows fixed no size, and the kernel stayed a plain loop nest (0.92 s
    of the model's 1.9). Chunks are one detection's rows here: min(5, n) * 100 rows, 100 a chunk."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 16)).astype("float32")

    def upsampling(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
        first = bb.emit(relax.op.strided_slice(x, axes=[0], begin=[0], end=[5]))
        rows = bb.emit(relax.op.reshape(first, [first.ty.shape[0] * 100, 8]))
        return relax.op.nn.relu(relax.op.matmul(rows, relax.const(w)))

    ex, compiled = _compiled(_fused(upsampling, (10, 10, 8)))
    (kernel,) = (f for f in _kernels(compiled).values() if not static_buffers(f) and "matmul" in f.script())
    text = kernel.script()
    assert "chunk" in text and "T.decl_buffer((T.int64(100), T.int64(8))" in text
    dev = build.device_for(build.make_target("llvm"))
    for count in (0, 1, 3, 5, 7):
        images = rng.standard_normal((count, 10, 10, 8)).astype("float32")
        got, = build.run(ex, dev, [images])
        np.testing.assert_allclose(got, np.maximum(images[:5].reshape(-1, 8) @ w, 0), rtol=1e-4, atol=1e-4)
