"""Normalisation rewrites: activations as vectorisable arithmetic, same numbers as TVM's own."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm import tirx

from autofuse import build
from autofuse import tvm_bridge
from autofuse.apply import apply_plan
from autofuse.tvm_bridge import extract_graph
from autofuse.tvm_bridge import normalize

ACTIVATIONS = {
    "gelu": relax.op.nn.gelu,
    "gelu_tanh": relax.op.nn.gelu_tanh,
    "sigmoid": relax.op.sigmoid,
    "silu": relax.op.nn.silu,
    "cube": lambda x: relax.op.power(x, relax.const(3.0, "float32")),
    "cube_prim_value": lambda x: relax.op.power(x, relax.prim_value(tirx.FloatImm("float32", 3.0))),
    "tanh": relax.op.tanh,
}


def _module(op, shape=(4, 64)):
    """main(x) = op(x), x a float32 tensor of `shape`."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _assert_computes_as_legalized(normal, mod, feed, tol):
    """The normalised module, built as autofuse builds it, gives TVM's own legalisation's numbers."""
    got = build.run(build.build(normal, build.make_target("llvm")), tvm.cpu(), [feed])[0]
    np.testing.assert_allclose(got, _run(relax.transform.LegalizeOps()(mod), feed), rtol=tol, atol=tol)


def _transposes(normal):
    """Transposes left in the normalised graph: 2 when the layout change reached only the model's
    input and output."""
    return sum("transpose" in node.op for node in extract_graph(normal).nodes)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_become_vectorisable_and_keep_their_values(name):
    mod = _module(ACTIVATIONS[name])
    normalized = normalize(mod)
    text = normalized.script()
    # no libm call left in any kernel: pow, erf, tanh and exp are products or polynomials
    for call in ("T.pow(", "T.erf(", "T.tanh(", "T.exp(", "T.sigmoid("):
        assert call not in text, (name, call)
    x = np.random.default_rng(0).uniform(-6, 6, (4, 64)).astype("float32")
    want = _run(relax.transform.LegalizeOps()(mod), x)
    got = build.run(build.build(normalized, build.make_target("llvm")), tvm.cpu(), [x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    assert len(extract_graph(normalized).nodes) >= 1


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("name", ["isnan", "isinf"])
def test_nan_and_inf_tests_are_bit_tests_with_ieee_answers(name, dtype):
    # TVM legalises isnan/isinf as calls run one element at a time; normalize tests the bits
    op, ref = getattr(relax.op, name), getattr(np, name)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64,), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.where(op(x), relax.const(0.0, dtype), x))
        bb.emit_func_output(out)
    normalized = normalize(bb.get())
    assert f"T.{name}(" not in normalized.script()
    a = np.random.default_rng(0).standard_normal(64).astype(dtype)
    a[:8] = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, np.finfo(dtype).max, np.finfo(dtype).tiny]
    got = build.run(build.build(normalized, build.make_target("llvm")), tvm.cpu(), [a])[0]
    np.testing.assert_array_equal(got, np.where(ref(a), 0, a).astype(dtype))


def test_batch_norm_after_a_non_conv_leaves_no_tuples_that_split_a_fused_group():
    # DenseNet's BN after a concat: decomposed for inference it left `t = (y, mean, var); x = t[0]`
    # between the ops around it, and a plan fusing them all failed with a cycle when emitted
    from autofuse import apply
    from autofuse.plan import FusionPlan
    from autofuse.tvm_bridge import main_block

    rng = np.random.default_rng(0)
    c = lambda *shape: relax.const(rng.standard_normal(shape).astype("float32"))  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.concat([x, relax.op.exp(x)], axis=1))
            var = relax.const(np.abs(rng.standard_normal(16)).astype("float32") + 0.5)
            bn = bb.emit(relax.op.nn.batch_norm(a, c(16), c(16), c(16), var, axis=1, training=False))
            out = bb.emit_output(relax.op.nn.relu(relax.TupleGetItem(bn, 0)))
        bb.emit_func_output(out)
    mod = bb.get()
    normal = normalize(mod)
    assert not any(isinstance(b.value, (relax.Tuple, relax.TupleGetItem)) for b in main_block(normal).bindings)
    graph = extract_graph(normal)
    fused = apply.apply_plan(normal, graph, FusionPlan.from_groups([range(len(graph))]))
    feed = rng.standard_normal((1, 8, 4, 4)).astype("float32")
    np.testing.assert_allclose(_run(fused, feed), _run(mod, feed), rtol=1e-4, atol=1e-5)


def _conv_then_transposed_conv(layout="NCHW"):
    rng = np.random.default_rng(1)
    c = lambda *shape: relax.const(rng.standard_normal(shape).astype("float32") * 0.3)  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8) if layout == "NCHW" else (1, 8, 8, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            if layout == "NCHW":
                y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, c(8, 4, 3, 3), padding=1)))
            up = relax.op.nn.conv2d_transpose(y, c(8 if layout == "NCHW" else 4, 4, 2, 2), strides=2,
                                              data_layout=layout)
            out = bb.emit_output(relax.op.nn.relu(up))
        bb.emit_func_output(out)
    return bb.get()


def test_transposed_convolution_beside_channels_last_convolutions_still_builds():
    # a U-Net's upsampling: ConvertLayout carried NHWC into conv2d_transpose, which TVM 0.27
    # cannot lower in that layout; every plan of the model failed at VM code generation
    from autofuse import apply
    from autofuse.plan import FusionPlan
    from autofuse.tvm_bridge import unlowered_ops

    mod = _conv_then_transposed_conv()
    normal = normalize(mod)
    assert unlowered_ops(normal) == [] and "conv2d_nhwc" in normal.script()
    graph = extract_graph(normal)
    fused = apply.apply_plan(normal, graph, FusionPlan.unfused(graph))
    feed = np.random.default_rng(2).standard_normal((1, 4, 8, 8)).astype("float32")
    np.testing.assert_allclose(_run(fused, feed), _run(mod, feed), rtol=1e-4, atol=1e-5)


def test_an_operator_tvm_cannot_lower_is_named_up_front():
    from autofuse.importer import ModelError
    from autofuse.tvm_bridge import unlowered_ops
    from autofuse.workload import prepare

    mod = _conv_then_transposed_conv("NHWC")
    assert unlowered_ops(normalize(mod)) == ["relax.nn.conv2d_transpose (NHWC)"]
    with pytest.raises(ModelError, match=r"no kernel for operator\(s\) relax.nn.conv2d_transpose \(NHWC\)"):
        prepare(mod)


def test_an_operator_tvm_cannot_lower_after_the_first_block_is_named_too():
    # ops after a detector's If sit in blocks of their own; one left unlowered there failed at
    # VM code generation instead (a concat, before shapes were inferred again after the layout pass)
    from autofuse.tvm_bridge import unlowered_ops

    x = relax.Var("x", relax.TensorType([1, 8, 8, 4], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            first = bb.emit_output(relax.op.nn.relu(x))
        between = bb.emit(relax.op.add(first, first))
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d_transpose(
                between, relax.const(np.ones((4, 4, 2, 2), "float32")), strides=2, data_layout="NHWC"))
        bb.emit_func_output(out)
    assert unlowered_ops(normalize(bb.get())) == ["relax.nn.conv2d_transpose (NHWC)"]


BETWEEN_CONVS = {
    "silu": lambda x: relax.op.multiply(x, relax.op.sigmoid(x)),
    "hard_swish": lambda x: relax.op.multiply(x, relax.op.clip(relax.op.add(x, relax.const(3.0)), 0, 6)),
    "leaky_relu": lambda x: relax.op.nn.leakyrelu(x, 0.1),
    "leaky_relu_steep": lambda x: relax.op.nn.leakyrelu(x, 1.5),
    "qdq_per_channel": lambda x: relax.op.dequantize(
        relax.op.quantize(x, relax.const(np.linspace(0.01, 0.05, 8).astype("float32")),
                          relax.const(np.arange(8).astype("int8")), axis=1, out_dtype="int8"),
        relax.const(np.linspace(0.01, 0.05, 8).astype("float32")), relax.const(np.arange(8).astype("int8")), axis=1),
    "qdq_uint8": lambda x: relax.op.dequantize(
        relax.op.quantize(x, relax.const(0.02), relax.const(128, "uint8"), out_dtype="uint8"),
        relax.const(0.02), relax.const(128, "uint8")),
}


@pytest.mark.parametrize("name", sorted(BETWEEN_CONVS))
def test_activations_and_quantization_between_convolutions_stay_channels_last(name):
    # ops with no layout rule in TVM 0.27 (clip, leaky ReLU, quantize/dequantize) or turned into
    # TIR calls before ConvertLayout ran (FastMathTransform's exp) had a transpose on each side:
    # EfficientNet-B0 1.30x and MobileNetV3-Large 1.18x end to end once they stay channels-last
    rng = np.random.default_rng(3)
    w1, w2 = (relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32") * 0.3) for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 12, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, w1, padding=1))
            b = bb.emit(BETWEEN_CONVS[name](a))
            out = bb.emit_output(relax.op.nn.conv2d(b, w2, padding=1))
        bb.emit_func_output(out)
    mod = bb.get()
    normal = normalize(mod)
    assert _transposes(normal) == 2  # the input's and the output's only
    if name.startswith("qdq"):  # and computed in float, without three casts per element through int8
        assert not any("cast" in n.op or "int" in n.dtype for n in extract_graph(normal).nodes)
    # quantization rounds the same values the same way as TVM's own legalisation (max diff 6e-6)
    _assert_computes_as_legalized(normal, mod, rng.standard_normal((1, 8, 12, 12)).astype("float32"), 1e-4)


@pytest.mark.parametrize("case", ["scalar", "per_channel", "constant_over_tensor", "prim_value"])
def test_division_by_a_constant_becomes_a_product(case):
    # HardSwish's / 6 in every MobileNetV3 epilogue, a decomposed batch norm's per-channel
    # / sqrt(var + eps) in DenseNet: a vector division costs ~10 products. A constant divided
    # by a tensor stays a division. A scalar PrimValue is a constant too (Mask R-CNN's mask
    # paste): the rewrite read it as a tensor constant and normalisation failed
    six = relax.const(6.0, "float32")
    scales = np.linspace(0.5, 3.0, 64).astype("float32")
    ops = {"scalar": lambda x: relax.op.divide(x, six),
           "per_channel": lambda x: relax.op.divide(x, relax.const(scales)),
           "constant_over_tensor": lambda x: relax.op.divide(six, x),
           "prim_value": lambda x: relax.op.divide(x, relax.prim_value(tirx.FloatImm("float32", 6.0)))}
    normalized = normalize(_module(ops[case]))
    assert (" / " not in normalized.script()) == (case != "constant_over_tensor")
    x = np.random.default_rng(0).uniform(1, 6, (4, 64)).astype("float32")
    got = build.run(build.build(normalized, build.make_target("llvm")), tvm.cpu(), [x])[0]
    want = {"scalar": x / np.float32(6), "per_channel": x / scales, "constant_over_tensor": np.float32(6) / x,
            "prim_value": x / np.float32(6)}[case]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("kernel, stride, padding", [(2, 2, 0), (3, 3, 0)])
def test_transposed_convolution_with_stride_equal_to_kernel_becomes_a_matmul(kernel, stride, padding):
    # each input pixel writes its own k x k block: a matmul and a transpose, not a convolution
    # over the input dilated with zeros (a U-Net's 2x2 upsampling: 3.3 ms -> a 42 us matmul)
    rng = np.random.default_rng(4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 5, 7), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((6, 4, kernel, kernel)).astype("float32"))
            up = relax.op.nn.conv2d_transpose(x, w, strides=stride, padding=padding)
            out = bb.emit_output(relax.op.add(up, relax.const(1.0)))
        bb.emit_func_output(out)
    mod = bb.get()
    normal = normalize(mod)
    ops = [n.op for n in extract_graph(normal).nodes]
    assert any("matmul" in op for op in ops) and not any("conv2d" in op for op in ops)
    _assert_computes_as_legalized(normal, mod, rng.standard_normal((1, 6, 5, 7)).astype("float32"), 1e-5)


@pytest.mark.parametrize("kernel, stride, padding, output_padding", [
    ((4, 4), (2, 2), (1, 1, 1, 1), (0, 0)),  # Keypoint R-CNN's heatmaps, DCGAN's generator
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # a kernel no multiple of the stride, output padded
    ((3, 3), (2, 2), (1, 1, 1, 1), (0, 0)),
    ((5, 4), (3, 2), (2, 0, 1, 1), (0, 1)),  # unequal axes and sides
    ((2, 2), (2, 2), (1, 1, 1, 1), (0, 0)),  # stride = kernel, but padded: no matmul
])
@pytest.mark.parametrize("batch", ["static", "run_time"])
def test_a_strided_transposed_convolution_is_one_convolution_of_its_output_phases(
        kernel, stride, padding, output_padding, batch):
    # TVM convolves the input dilated with zeros: stride^2 times the work, and no schedule
    # over a run-time batch (Keypoint R-CNN's 4x4 stride-2 over its detections: 445 ms)
    rng = np.random.default_rng(6)
    n = tirx.Var("n", "int64") if batch == "run_time" else 2
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 6, 5, 7), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((6, 4, *kernel)).astype("float32"))
            up = relax.op.nn.conv2d_transpose(x, w, strides=stride, padding=padding, output_padding=output_padding)
            out = bb.emit_output(relax.op.nn.relu(up))
        bb.emit_func_output(out)
    mod = bb.get()
    normal = normalize(mod)
    ops = [n.op for n in extract_graph(normal).nodes]
    assert not any("conv2d_transpose" in op for op in ops) and any("conv2d" in op for op in ops), ops
    _assert_computes_as_legalized(normal, mod, rng.standard_normal((2, 6, 5, 7)).astype("float32"), 1e-4)


@pytest.mark.parametrize("op, rows, channels, computed", [
    ("conv2d", 36, 21, 24), ("conv2d", 36, 3, 8), ("conv3d", 72, 21, 24), ("conv1d", 6, 258, 264),
    ("conv1d", 6, 16, 16), ("conv2d", 36, 24, 24), ("conv2d", 36, 1, 1),
    # above 32 channels, whole AVX-512 vectors: RetinaNet's 9 x 91 classes and 9 x 4 box coordinates
    ("conv2d", 36, 40, 48), ("conv2d", 36, 819, 832), ("conv2d", 36, 36, 48), ("conv2d", 36, 48, 48),
    ("conv3d", 72, 40, 40), ("conv2d_1x1", 36, 40, 40), ("conv2d_1x1", 36, 36, 36),  # 8 taps: writes cost most
    ("matmul", 3, 101, 104), ("matmul", 3, 200, 200), ("matmul", 3, 21, 21),
    ("matmul", 8, 101, 112), ("matmul", 8, 200, 208), ("matmul", 8, 120, 120), ("matmul", 8, 8210, 8224)])
def test_output_channels_no_vector_divides_are_computed_padded_and_sliced(op, rows, channels, computed):
    # a detection head's 255 channels, a segmentation head's 21 classes: without whole vectors
    # of output channels the kernel fell back to a dot product per output (64 -> 255 channels
    # on a 20x20 image: 33.6 ms, 0.79 padded; scripts/ragged_shapes.py channels). A matmul over
    # several rows also needs an even number of vectors or a multiple of 3 for tiles wider than
    # one vector (a CRNN's 32 x 1024 x 8210 output layer: 4.5 -> 3.1 ms alone); a 2-D convolution
    # over 32 channels a multiple of 16 (tvm_bridge.conv_channels)
    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    shape = {"conv2d": (1, 8, 6, 6), "conv2d_1x1": (1, 8, 6, 6), "conv3d": (1, 8, 2, 6, 6),
             "conv1d": (1, 8, rows)}.get(op, (rows, 40))
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if op == "conv2d":
                w = relax.const(rng.standard_normal((channels, 8, 3, 3)).astype("float32"))
                y = relax.op.nn.conv2d(x, w, padding=1)
            elif op == "conv2d_1x1":
                y = relax.op.nn.conv2d(x, relax.const(rng.standard_normal((channels, 8, 1, 1)).astype("float32")))
            elif op == "conv3d":
                w = relax.const(rng.standard_normal((channels, 8, 3, 3, 3)).astype("float32"))
                y = relax.op.nn.conv3d(x, w, padding=1)
            elif op == "conv1d":  # Silero VAD's STFT: 258 channels (the model 0.84 -> 0.14 ms)
                w = relax.const(rng.standard_normal((channels, 8, 3)).astype("float32"))
                y = relax.op.nn.conv1d(x, w, padding=1)
            else:
                y = relax.op.matmul(x, relax.const(rng.standard_normal((40, channels)).astype("float32")))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    mod = bb.get()
    normal = normalize(mod)
    widths = {n.shape[-1] for n in extract_graph(normal).nodes if op.split("_")[0] in n.op}
    assert widths == {computed}
    assert ("strided_slice" in normal.script()) == (computed != channels)
    _assert_computes_as_legalized(normal, mod, rng.standard_normal(shape).astype("float32"), 1e-4)


def test_whole_tile_columns_are_two_or_three_vectors_wide():
    from autofuse.tvm_bridge import CHANNEL_MULTIPLE
    from autofuse.tvm_bridge import whole_tile_columns

    for columns in range(1, 2000):
        n = whole_tile_columns(columns)
        vectors = n // CHANNEL_MULTIPLE
        assert n >= columns and n % CHANNEL_MULTIPLE == 0 and (vectors % 2 == 0 or vectors % 3 == 0)
        assert n - columns < 2 * CHANNEL_MULTIPLE  # the least such count: 8 x odd -> 8 x (odd + 1)


@pytest.mark.parametrize("dims, groups", [(1, 1), (1, 4), (3, 1), (3, 4)])
def test_1d_and_3d_convolutions_run_channels_last(dims, groups):
    # an audio model's feature extractor and positional convolution (wav2vec2): in NCW the
    # output channels are not the contiguous axis and nothing vectorised (its grouped 16-tap
    # convolution 1011 us, 38 channels-last; the model 3.4 -> 0.97 ms). A video model's 3-D
    # convolutions likewise (R3D-18's 64 -> 64 on 8x56x56: 1.14 s a call in NCDHW, 27 ms NDHWC)
    rng = np.random.default_rng(6)
    bb = relax.BlockBuilder()
    shape = (1, 16, 50) if dims == 1 else (1, 16, 4, 6, 7)
    conv = {1: relax.op.nn.conv1d, 3: relax.op.nn.conv3d}[dims]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w1 = relax.const(rng.standard_normal((16, 16 // groups) + (3,) * dims).astype("float32"))
            a = bb.emit(relax.op.nn.gelu(conv(x, w1, strides=2, groups=groups)))
            w2 = relax.const(rng.standard_normal((16, 16) + (3,) * dims).astype("float32"))
            out = bb.emit_output(conv(a, w2, padding=1))
        bb.emit_func_output(out)
    mod = bb.get()
    normal = normalize(mod)
    assert _transposes(normal) == 2  # the input's and the output's only
    assert {1: "conv1d_nwc", 3: "conv3d_ndhwc"}[dims] in normal.script()
    _assert_computes_as_legalized(normal, mod, rng.standard_normal(shape).astype("float32"), 1e-4)


@pytest.mark.parametrize(("length", "positions", "computed"), [(399, 199, 200), (3199, 1599, 1600), (401, 200, 200), (67, 33, 35), (19, 9, 9)])
def test_1d_convolutions_compute_whole_register_tiles_of_positions(length, positions, computed):
    # wav2vec2's feature extractor: 1599, 799, 199 frames that no row tile divides; its last tile
    # was predicated and every tile then kept its accumulators in memory (512 -> 512 channels
    # over 199 positions: 3.8 ms, 2.1 ms computed over 200 and sliced)
    from autofuse.schedule import schedule_cpu
    from autofuse.schedule import unscheduled_kernels

    rng = np.random.default_rng(7)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, length), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((32, 16, 3)).astype("float32"))
            out = bb.emit_output(relax.op.nn.gelu(relax.op.nn.conv1d(x, w, strides=2)))
        bb.emit_func_output(out)
    mod = bb.get()
    normal = normalize(mod)
    convs = [n for n in extract_graph(normal).nodes if "conv1d" in n.op]
    assert [n.shape[1] for n in convs] == [computed]
    assert ("strided_slice" in normal.script()) == (computed != positions)
    for gv, func in unscheduled_kernels(normal).items():
        if "conv1d" in gv.name_hint:
            # a predicated tile exactly where no tile of 4-8 rows divides what is computed
            whole = any(computed % t == 0 for t in range(4, 9))
            assert ("T.where" in schedule_cpu(func, 16, 16).script()) != whole
    _assert_computes_as_legalized(normal, mod, rng.standard_normal((1, 16, length)).astype("float32"), 1e-4)


@pytest.mark.parametrize("tail", ["squeeze", "permute_dims", "stack"])
def test_ops_whose_layout_rules_fail_are_rewritten_so_convolutions_go_channels_last(tail):
    # Silero VAD's x.squeeze(-1) after a 1-D convolution, a CRNN's stacked LSTM steps: TVM's
    # ConvertLayout failed on negative axes (std::bad_alloc) and on stack ("Index -1 out of
    # bounds"), and the models' convolutions stayed channels-first (the CRNN 69.9 -> 19.5 ms)
    rng = np.random.default_rng(8)
    w = relax.const(rng.standard_normal((8, 16, 1)).astype("float32"))
    tails = {"squeeze": lambda y: relax.op.squeeze(y, axis=[-1]),
             "permute_dims": lambda y: relax.op.permute_dims(y, [0, -1, -2]),
             "stack": lambda y: relax.op.stack([y, relax.op.multiply(y, relax.const(2.0, "float32"))], axis=-1)}
    mod = _module(lambda x: tails[tail](relax.op.nn.relu(relax.op.nn.conv1d(x, w))), (1, 16, 1))
    notes: list[str] = []
    normal = normalize(mod, notes)
    assert notes == [] and "conv1d_nwc" in normal.script()
    _assert_computes_as_legalized(normal, mod, rng.standard_normal((1, 16, 1)).astype("float32"), 1e-5)


def test_a_layout_pass_failure_keeps_the_model_channels_first(monkeypatch, tmp_path):
    # torch 2.14's dynamo export of a 1-D conv net made ConvertLayout fail (std::bad_alloc) and
    # the model did not import; now the import notes it, keeps NCW and computes the same numbers
    import onnx

    from autofuse.apply import apply_plan
    from autofuse.importer import random_inputs
    from autofuse.models import conv_block
    from autofuse.workload import prepare

    def failing(_layouts):
        raise tvm.error.InternalError("std::bad_alloc")

    path = tmp_path / "conv_block.onnx"
    onnx.save(conv_block(), path)
    reference = prepare(path)
    monkeypatch.setattr(relax.transform, "ConvertLayout", failing)
    kept = prepare(path)
    assert any("channels-last layout not applied (std::bad_alloc)" in n for n in kept.loaded.notes)
    with pytest.warns(UserWarning, match="channels-last layout not applied"):  # no notes to add to
        normalize(reference.loaded.mod)
    assert "conv2d_nchw" in kept.mod.script() and "conv2d_nchw" not in reference.mod.script()
    target = build.make_target("llvm")
    feeds = random_inputs(reference.inputs)
    want, got = (build.run(build.build(apply_plan(w.mod, w.graph, w.tvm_default()), target), tvm.cpu(), feeds)
                 for w in (reference, kept))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_block_the_layout_pass_fails_on_keeps_its_layout_and_the_others_change():
    # Keypoint R-CNN: TVM's ConvertLayout refused the block of its keypoint head (over a run-time
    # number of detections), and the whole model, backbone included, stayed channels-first
    x = relax.Var("x", relax.TensorType([1, 4, 8, 8], "float32"))
    w = relax.const(np.ones((4, 4, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            first = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=1))))
        between = bb.emit(relax.op.add(first, first))  # outside any dataflow block, as an If is
        with bb.dataflow():
            second = bb.emit_output(relax.op.nn.conv2d(between, w, padding=1))
        bb.emit_func_output(second)
    mod = bb.get()
    calls = []

    def second_fails(piece: tvm.IRModule) -> tvm.IRModule:
        calls.append(piece)
        if len(calls) > 1:  # the second block, and again with its outputs cast
            raise tvm.error.InternalError("DataflowBlock Pass should not rewrite or delete any global-scope Var")
        return relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(piece)

    out, note = tvm_bridge._block_by_block(mod, second_fails)
    assert len(calls) == 3 and note.startswith("channels-last layout not applied to block 2 (DataflowBlock Pass")
    layouts = [str(b.value.attrs.data_layout) for block in out["main"].body.blocks for b in block.bindings
               if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d"]
    assert layouts == ["NHWC", "NCHW"]


def test_a_size_beside_a_tensor_in_a_module_given_directly_becomes_a_tensor():
    # TVM's ConvertLayout segfaulted on a binary op with a size (a PrimValue) as an operand
    # (Keypoint R-CNN's `argmax % width`), or a number (Mask R-CNN's 30 / 28, folded by TVM's
    # frontend into a float immediate); the ONNX import now makes such scalars tensors itself, a
    # Relax module handed over as it is goes through LayoutFriendlyOps
    k = tirx.Var("k", "int64")
    x = relax.Var("x", relax.TensorType([1, 4, 8, 8], "float32"))
    idx = relax.Var("idx", relax.TensorType([k], "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, idx]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((4, 4, 3, 3), "float32")), padding=1))
            column = bb.emit(relax.op.floor_mod(idx, relax.prim_value(k)))
            scaled = bb.emit(relax.op.multiply(conv, relax.prim_value(tirx.FloatImm("float32", 2.0))))
            out = bb.emit_output(relax.Tuple([conv, column, scaled]))
        bb.emit_func_output(out)
    normal = normalize(bb.get())
    xs = np.random.default_rng(4).standard_normal((1, 4, 8, 8)).astype("float32")
    got = build.run(build.build(normal, build.make_target("llvm")), tvm.cpu(), [xs, np.array([3, 9, 5], "int64")])
    np.testing.assert_array_equal(got[1], np.array([0, 0, 2]))
    np.testing.assert_array_equal(got[2], got[0] * 2)


def test_slices_to_a_run_time_bound_fuse_as_tvm_fuses_and_keep_their_values():
    # Mask R-CNN's box head slices its min(1000, n) detections by that bound: TVM typed the
    # result with if_then_else(bound < 0, ...), and FuseOps failed on that type ("Cannot find
    # the FInferType attribute ... prim.if_then_else")
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 9], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            most = tirx.min(tirx.IntImm("int64", 3), n)
            kept = bb.emit(relax.op.exp(relax.op.strided_slice(x, [0], [0], [most])))
            again = bb.emit(relax.op.strided_slice(kept, [0], [0], [most]))
            every_fourth = bb.emit(relax.op.strided_slice(again, [1], [1], [2**63 - 1], [4]))
            out = bb.emit_output(relax.op.add(every_fourth, relax.op.strided_slice(again, [1], [0], [2])))
        bb.emit_func_output(out)
    normal = normalize(bb.get())
    graph = extract_graph(normal)
    ex = build.build(apply_plan(normal, graph, tvm_bridge.fuseops_plan(normal, graph)), build.make_target("llvm"))
    for rows in (2, 5):
        xs = np.random.default_rng(rows).standard_normal((rows, 9)).astype("float32")
        got, = build.run(ex, tvm.cpu(), [xs])
        kept = np.exp(xs[:3])
        np.testing.assert_allclose(got, kept[:, 1::4] + kept[:, :2], rtol=1e-6)


@pytest.mark.parametrize("parts", [[], 1])
def test_a_split_into_one_part_lets_the_block_go_channels_last(parts):
    # torchvision splits the boxes per image; with one image, a split into one part, which TVM
    # types as its input (no tuple), and its layout rule then failed ("out_tuple != nullptr"):
    # Mask R-CNN's whole backbone stayed channels-first
    x = relax.Var("x", relax.TensorType([1, 4, 8, 8], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((4, 4, 3, 3), "float32")), padding=1))
            part = bb.emit(relax.op.split(conv, parts, axis=1))
            out = bb.emit_output(relax.op.nn.relu(part))
        bb.emit_func_output(out)
    mod = bb.get()
    notes: list[str] = []
    normal = normalize(mod, notes)
    assert not notes and _transposes(normal) == 2  # the input's and the output's only
    _assert_computes_as_legalized(normal, mod, np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype("float32"),
                                  1e-5)


def test_a_block_over_a_run_time_count_of_images_goes_channels_last_and_runs():
    # Keypoint R-CNN's head, over min(20, detections) images: TVM's ConvertLayout inferred the
    # first 20 of n as min(20, n) - min(0, n) and refused to change the block's outputs ("should
    # not rewrite or delete any global-scope Var"); with them cast, the concat of such rows with
    # rows of min(20, n) was then not lowered. The head stayed channels-first: 80 s of 82
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4, 3, 3)).astype("float32")
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([1, 4, 8, 8], "float32"))
    images = relax.Var("images", relax.TensorType(None, "float32", ndim=4))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, images]):
        with bb.dataflow():
            first = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), padding=1))
        between = bb.emit(relax.op.add(first, first))  # outside any dataflow block, as an If is
        with bb.dataflow():
            sized = bb.match_cast(images, relax.TensorType([n, 4, 8, 8], "float32"))
            head = bb.emit(relax.op.strided_slice(sized, axes=[0], begin=[0], end=[20]))
            conv = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(head, relax.const(w), padding=1)))
            total = bb.emit(relax.op.expand_dims(relax.op.sum(conv, axis=[1, 2, 3]), 1))
            corner = bb.emit(relax.op.strided_slice(head, axes=[1, 2, 3], begin=[0, 0, 0], end=[1, 1, 1]))
            corner = bb.emit(relax.op.squeeze(corner, axis=[2, 3]))
            joined = bb.emit_output(relax.op.concat([total, corner], axis=1))
        out = bb.emit(relax.Tuple([between, conv, joined]))
        bb.emit_func_output(out)
    normal = normalize(bb.get())
    outputs = [f.params[-1].shape[1:] for gv, f in normal.functions_items() if "conv2d" in gv.name_hint]
    assert [[int(d) for d in shape] for shape in outputs] == [[8, 8, 4]] * 2  # both channels-last
    ex = build.build(normal, build.make_target("llvm"))
    xs = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    for count in (3, 25):
        batch = rng.standard_normal((count, 4, 8, 8)).astype("float32")
        got = build.run(ex, tvm.cpu(), [xs, batch])
        want = [_conv(xs, w) * 2, np.maximum(_conv(batch[:20], w), 0)]
        want.append(np.concatenate([want[1].sum((1, 2, 3))[:, None], batch[:20, 0, 0, :1]], axis=1))
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 convolution, padding 1, NCHW / OIHW."""
    h, wd = x.shape[2:]
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return sum(np.einsum("nchw,oc->nohw", padded[:, :, i:i + h, j:j + wd], w[:, :, i, j])
               for i in range(3) for j in range(3))


@pytest.mark.parametrize("indices, axis, sliced", [
    (3, 1, True), (-1, 2, True), ([2], 1, True), ([1, 3, 5], 2, True), ([-4, -3, -2], 1, True),
    ([0, 2, 1], 1, False), ([[0, 1]], 1, False), ([4, 4], 2, False)])
def test_a_take_of_constant_indices_in_steps_is_a_slice_that_fuses(indices, axis, sliced):
    # `x[:, i]` exported as ONNX Gather, Mamba's scan unrolled into 32 of them a layer: TVM marks
    # take opaque (its index read at run time), a kernel of its own in every plan (257 of
    # Mamba's 688); as a slice it fuses into the ops that read it, in TVM's plan too
    def op(x):
        picked = relax.op.take(x, relax.const(np.array(indices, "int64")), axis=axis)
        return relax.op.multiply(picked, relax.const(2.0, "float32"))

    shape = (2, 6, 8)
    mod = _module(op, shape)
    normal = normalize(mod)
    graph = extract_graph(normal)
    assert any("take_slice" in n.op for n in graph.nodes) == sliced
    assert all(n.fusable for n in graph.nodes) == sliced
    groups = tvm_bridge.fuseops_plan(normal, graph).groups
    assert (len(groups) == 1) == sliced  # the slice and the multiply: one kernel of TVM's plan
    x = np.random.default_rng(5).standard_normal(shape).astype("float32")
    got = build.run(build.build(normal, build.make_target("llvm")), tvm.cpu(), [x])[0]
    np.testing.assert_array_equal(got, np.take(x, np.array(indices), axis=axis) * np.float32(2))


def _scattered(scatter, shape, updates, kernel, overwrites, rng):
    """(x, the normalised module's output) of `scatter(x, updates * 2) + 1` on a random x: the
    scatter rewritten as the injective `kernel` that fuses with its neighbours where it
    `overwrites`, left an opaque kernel of its own otherwise."""

    def op(x):
        new = relax.op.multiply(relax.const(updates), relax.const(2.0, "float32"))
        return relax.op.add(scatter(x, new), relax.const(1.0, "float32"))

    normal = normalize(_module(op, shape))
    graph = extract_graph(normal)
    assert any(kernel in n.op for n in graph.nodes) == overwrites
    assert all(n.fusable for n in graph.nodes) == overwrites
    x = rng.standard_normal(shape).astype("float32")
    return x, build.run(build.build(normal, build.make_target("llvm")), tvm.cpu(), [x])[0]


@pytest.mark.parametrize("index, axis, overwrites", [
    (2, 1, True), (-1, 2, True), ("mixed", 1, False), ("partial", 1, False), ("reduce", 1, False)])
def test_a_scatter_that_overwrites_one_constant_slice_is_a_select_that_fuses(index, axis, overwrites):
    # `out[:, t] = y`, a scan's output written a step at a time (RWKV: 32 ScatterElements a
    # layer, each a kernel copying the whole tensor): the updates at that slice, the data elsewhere
    shape = (2, 6, 8)
    given = [2, 6, 8]
    given[axis] = 1
    if index == "partial":  # updates narrower than the data in another axis
        given[2] = 4
    picked = np.full(given, 3 if isinstance(index, str) else index, "int64")
    if index == "mixed":  # two slices written
        picked[0] = 1
    reduction = "add" if index == "reduce" else "update"
    rng = np.random.default_rng(6)
    updates = rng.standard_normal(given).astype("float32")

    x, got = _scattered(lambda x, new: relax.op.scatter_elements(
        x, relax.const(picked), new, axis=axis, reduction=reduction), shape, updates, "scatter_slice", overwrites, rng)
    want = x.copy()
    for at in np.ndindex(*given):  # ONNX ScatterElements, element by element
        to = list(at)
        to[axis] = picked[at]
        want[tuple(to)] = want[tuple(to)] + updates[at] * 2 if reduction == "add" else updates[at] * 2
    np.testing.assert_allclose(got, want + 1, rtol=1e-6)


def _grid(starts, counts, steps):
    """ScatterND indices (*counts, M) enumerating a block in steps along the first M axes."""
    axes = np.indices(counts)
    return np.stack([s + d * axes[j] for j, (s, d) in enumerate(zip(starts, steps))], -1).astype("int64")


@pytest.mark.parametrize("picked, reduction, overwrites", [
    (_grid([0], [4], [1]), "update", True),                   # x[0:4] = y
    (_grid([2], [5], [1]), "update", True),
    (_grid([-7], [3], [2]), "update", True),                  # x[1:6:2] = y, negative indices
    (_grid([1, 0], [2, 3], [1, 1]), "update", True),          # x[1:3, 0:3] = y
    (_grid([0, 1], [4, 2], [2, 1]), "update", True),          # x[0:8:2, 1:3] = y
    (np.array([[1], [3], [2]], "int64"), "update", False),    # rows out of order
    (_grid([0], [4], [1]), "add", False),
    (np.array([[1, 2], [4, 0]], "int64"), "update", False),   # two elements, not a block
    (np.array([[[0, 0], [0, 1]], [[2, 0], [1, 1]]], "int64"), "update", False),
])
def test_a_block_a_scatter_nd_overwrites_in_steps_is_a_select_that_fuses(picked, reduction, overwrites):
    # `x[a:b] = y`, `x[:, a:b] = y` exported as ScatterND (Funnel's relative-position shift:
    # four of them, 240 of its 453 us of kernel time): the updates inside the block, the data
    # elsewhere
    shape = (8, 3, 5)
    rng = np.random.default_rng(8)
    updates = rng.standard_normal((*picked.shape[:-1], *shape[picked.shape[-1]:])).astype("float32")
    x, got = _scattered(lambda x, new: relax.op.scatter_nd(x, relax.const(picked), new, reduction=reduction),
                        shape, updates, "scatter_block", overwrites, rng)
    want = x.copy()
    for at in np.ndindex(*picked.shape[:-1]):  # ONNX ScatterND, update by update
        to = tuple(picked[at])
        want[to] = want[to] + updates[at] * 2 if reduction == "add" else updates[at] * 2
    np.testing.assert_allclose(got, want + 1, rtol=1e-6)


def test_constant_index_slices_and_selects_build_for_cuda():
    # the rewritten ops are TE computes emitted before legalisation: DLight schedules them like
    # any injective kernel, fused with their neighbours, and they land in the CUDA module
    from autofuse import apply
    from autofuse.gpu_resources import cuda_source

    picked = np.full((2, 1, 8), 3, "int64")

    def op(x):
        step = relax.op.take(x, relax.const(np.array(2, "int64")), axis=1)  # (2, 8)
        row = relax.op.expand_dims(relax.op.multiply(step, relax.const(2.0, "float32")), 1)
        written = relax.op.scatter_elements(x, relax.const(picked), row, axis=1)
        block = relax.op.multiply(relax.op.strided_slice(written, [1], [0], [3]), relax.const(3.0, "float32"))
        return relax.op.scatter_nd(written, relax.const(_grid([0, 2], [2, 3], [1, 1])), block)

    normal = normalize(_module(op, (2, 6, 8)))
    graph = extract_graph(normal)
    kinds = {"take_slice", "scatter_slice", "scatter_block"}
    assert kinds <= {n.op for n in graph.nodes} and all(n.fusable for n in graph.nodes)
    plan = tvm_bridge.fuseops_plan(normal, graph)
    fused, kernels = apply.fuse(normal, graph, plan)
    source = cuda_source(build.build(fused, build.make_target("cuda:sm_90")).mod)
    assert source is not None and all(f"{k}_kernel" in source for k in set(kernels))


def test_indices_computed_from_constants_are_folded_first_and_only_when_some_are():
    # ONNX's negative indices come wrapped, `where(i < 0, i + n, i)`: a constant only once folded.
    # An embedding lookup (a constant table at run-time ids) is no candidate: folding a whole
    # model's weights early for it took BERT-base 3 s and renumbered every model's kernels
    from autofuse.tvm_bridge import _indexed_by_constants

    def wrapped(x):
        i = relax.const(-2, "int64")
        at = relax.op.where(relax.op.less(i, relax.const(0, "int64")), relax.op.add(i, relax.const(6, "int64")), i)
        return relax.op.take(x, at, axis=1)

    mod = _module(wrapped, (2, 6, 8))
    assert _indexed_by_constants(relax.transform.Normalize()(mod), ("relax.take",))
    normal = normalize(mod)
    assert [n.op for n in extract_graph(normal).nodes] == ["take_slice"]
    x = np.random.default_rng(7).standard_normal((2, 6, 8)).astype("float32")
    got = build.run(build.build(normal, build.make_target("llvm")), tvm.cpu(), [x])[0]
    np.testing.assert_array_equal(got, x[:, 4])

    for table_is_constant in (True, False):  # an embedding lookup; a gather of activations
        bb = relax.BlockBuilder()
        ids = relax.Var("ids", relax.TensorType((1, 4), "int64"))
        rows = relax.Var("rows", relax.TensorType((10, 8), "float32"))
        with bb.function("main", [ids, rows]):
            with bb.dataflow():
                table = relax.const(np.ones((10, 8), "float32")) if table_is_constant else rows
                out = bb.emit_output(relax.op.take(table, ids, axis=0))
            bb.emit_func_output(out)
        assert not _indexed_by_constants(bb.get(), ("relax.take",))


def _relu_conv(op, image, kernel, stride, dilation, padding, groups, rng):
    """A module of one convolution (8 -> 16 channels, NCHW, random constant weights) and a ReLU,
    and its input's shape."""
    shape = (1, 8, *image)
    conv = {"conv1d": relax.op.nn.conv1d, "conv2d": relax.op.nn.conv2d, "conv3d": relax.op.nn.conv3d}[op]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((16, 8 // groups, *kernel)).astype("float32"))
            out = bb.emit_output(relax.op.nn.relu(conv(x, w, strides=stride, padding=padding, dilation=dilation,
                                                       groups=groups)))
        bb.emit_func_output(out)
    return bb.get(), shape


@pytest.mark.parametrize("op, image, kernel, stride, dilation, padding, groups, computed", [
    ("conv2d", (14, 14), (3, 3), 1, 36, 36, 1, (1, 1)),  # DeepLabV3's ASPP at 224x224: a 1x1
    ("conv2d", (14, 14), (3, 3), 1, 24, 24, 1, (1, 1)),
    ("conv2d", (14, 14), (3, 3), 1, 12, 12, 1, (3, 3)),  # every tap reads the image somewhere
    ("conv2d", (2, 2), (7, 7), 1, 1, 3, 1, (3, 3)),  # a 7x7 kernel over a 2x2 map
    ("conv2d", (1, 6), (3, 3), 1, 1, 1, 4, (1, 3)),  # one row: only the middle row of taps
    ("conv2d", (3, 3), (5, 5), 2, 1, 2, 1, (5, 5)),  # strided: the outer taps still read
    ("conv1d", (4,), (7,), 1, 2, 6, 1, (3,)),
    ("conv3d", (1, 5, 5), (3, 3, 3), 1, 1, 1, 1, (1, 3, 3)),  # one frame
])
def test_taps_that_read_only_padding_are_left_out(op, image, kernel, stride, dilation, padding, groups, computed,
                                                  monkeypatch):
    monkeypatch.setattr(tvm_bridge, "TAPS_APART_GAIN", float("inf"))  # one convolution, as LiveTaps leaves it
    rng = np.random.default_rng(8)
    mod, shape = _relu_conv(op, image, kernel, stride, dilation, padding, groups, rng)
    normal = normalize(mod)
    # the convolution kernel's weight buffer, channels-last: the spatial taps lead
    convs = [f for gv, f in normal.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and op in gv.name_hint]
    assert [tuple(int(d) for d in f.params[1].shape)[: len(kernel)] for f in convs] == [computed]
    _assert_computes_as_legalized(normal, mod, rng.standard_normal(shape).astype("float32"), 1e-4)


def test_live_taps_along_one_axis():
    from autofuse.tvm_bridge import live_taps

    assert live_taps(14, 3, 1, 1, 1, 1) is None  # an ordinary 3x3 convolution is left as it is
    assert live_taps(14, 3, 1, 36, 36, 36) == (1, 1, 0, 0)  # the centre tap alone, no padding
    assert live_taps(2, 7, 1, 1, 3, 3) == (2, 3, 1, 1)  # 7 taps over 2 pixels: the middle 3


def test_each_taps_outputs_along_one_axis():
    from autofuse.tvm_bridge import tap_outputs

    # dilation 12 on 14 pixels: the outer taps read the image at 2 outputs each, the centre at all
    assert tap_outputs(14, 3, 1, 12, 12, 12) == [(12, 2), (0, 14), (0, 2)]
    assert tap_outputs(7, 3, 1, 1, 1, 1) == [(1, 6), (0, 7), (0, 6)]
    assert tap_outputs(6, 3, 2, 1, 1, 1) == [(1, 2), (0, 3), (0, 3)]  # stride 2: outputs 0, 1, 2
    assert tap_outputs(14, 3, 1, 36, 36, 36) == [(36, 0), (0, 14), (0, 0)]  # outer taps never read it


@pytest.mark.parametrize("op, image, kernel, stride, dilation, padding, groups, taps", [
    ("conv2d", (14, 14), (3, 3), 1, 12, 12, 1, [(1, 1)] * 9),  # DeepLabV3's ASPP at 224x224, rate 12
    ("conv2d", (14, 14), (3, 3), 1, 6, 6, 1, [(1, 1)] * 9),  # rate 6: 1.96 times the work dense
    ("conv2d", (14, 14), (3, 3), 1, 12, 12, 8, [(1, 1)] * 9),  # grouped
    ("conv2d", (18, 28), (3, 3), 2, 12, 12, 1, [(1, 1)] * 9),  # stride 2
    ("conv2d", (14, 14), (3, 3), 1, (12, 1), (12, 1, 12, 1), 1, [(1, 3)] * 3),  # apart along the height only
    ("conv2d", (7, 7), (3, 3), 1, 1, 1, 1, [(3, 3)]),  # an ordinary 3x3 convolution: left as it is
    ("conv2d", (2, 2), (3, 3), 1, 1, 1, 1, [(3, 3)]),  # 2.25 times the work dense, but on 4 outputs
    ("conv1d", (80,), (5,), 1, 30, 60, 1, [(1,)] * 5),
    ("conv3d", (4, 14, 14), (3, 3, 3), 1, (1, 12, 12), (1, 12, 12), 1, [(3, 1, 1)] * 9),
])
def test_taps_that_read_mostly_padding_are_computed_apart(op, image, kernel, stride, dilation, padding, groups,
                                                           taps):
    rng = np.random.default_rng(9)
    mod, shape = _relu_conv(op, image, kernel, stride, dilation, padding, groups, rng)
    normal = normalize(mod)
    # each convolution call's taps (its kernel's weight buffer's leading axes, channels-last)
    convs = [normal[node.op] for node in extract_graph(normal).nodes if op in node.op]
    assert sorted(tuple(int(d) for d in f.params[1].shape)[: len(kernel)] for f in convs) == taps
    _assert_computes_as_legalized(normal, mod, rng.standard_normal(shape).astype("float32"), 1e-4)


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-4), ("float16", 4e-3)])
def test_a_group_norm_takes_its_variance_in_two_passes_and_half_precision_sums_in_float32(dtype, tol):
    # TVM's own group norm takes E[x^2] - E[x]^2 in one pass, which cancels for groups far from
    # zero (at 50 +- 3: the variance 9 of 2509 - 2500); and 16,384 float16 values near 50 sum past
    # float16's largest, 65,504
    from autofuse.tvm_bridge import _LEGALIZATIONS

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, 64, 32), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            ones, zeros = relax.const(np.ones(32, dtype)), relax.const(np.zeros(32, dtype))
            y = bb.emit_output(relax.op.nn.group_norm(x, ones, zeros, 8, channel_axis=3, axes=[1, 2]))
        bb.emit_func_output(y)
    vm = relax.VirtualMachine(tvm.compile(relax.transform.LegalizeOps(_LEGALIZATIONS)(bb.get()), target="llvm"),
                              tvm.cpu())
    a = (np.random.default_rng(0).standard_normal((1, 64, 64, 32)) * 3 + 50).astype(dtype)
    g = a.astype("float64").reshape(1, 64, 64, 8, 4)
    want = (g - g.mean(axis=(1, 2, 4), keepdims=True)) / np.sqrt(g.var(axis=(1, 2, 4), keepdims=True) + 1e-5)
    got = vm["main"](tvm.runtime.tensor(a)).numpy().astype("float64")
    np.testing.assert_allclose(got, want.reshape(a.shape), rtol=tol, atol=tol)
