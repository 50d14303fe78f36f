"""onnxruntime's com.microsoft operators (autofuse.onnx_contrib) match onnxruntime, and contrib
nodes never meet a standard operator's converter of the same name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import import_and_run

from autofuse.importer import run_onnxruntime
from autofuse.importer import unsupported_ops

F = TensorProto.FLOAT
MS = "com.microsoft"


def contrib(op: str, inputs: dict[str, tuple[tuple[int, ...], int]], outputs: dict[str, tuple[int, ...]],
            consts: dict[str, np.ndarray] | None = None, domain: str = MS, **attrs) -> onnx.ModelProto:
    """One node of `op` on graph inputs {name: (shape, elem type)} and constant initializers."""
    consts = consts or {}
    node = helper.make_node(op, [*inputs, *consts], list(outputs), domain=domain, **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, t, list(s)) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(n, F, list(s)) for n, s in outputs.items()],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def check(model: onnx.ModelProto, tmp_path) -> None:
    assert not unsupported_ops(model)
    tmp_path.mkdir(exist_ok=True)
    w, feeds, got = import_and_run(model, tmp_path)
    want = run_onnxruntime(model, w.inputs, feeds)
    assert len(got) == len(want)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def rand(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


X = {"x": ((2, 5, 16), F)}


@pytest.mark.parametrize("case", ["Gelu", "BiasGelu", "FastGelu", "FastGelu+bias", "QuickGelu"])
def test_activations(tmp_path, case):
    op, _, bias = case.partition("+")
    consts = {"b": rand(16)} if bias or op == "BiasGelu" else {}
    attrs = {"alpha": 1.5} if op == "QuickGelu" else {}
    check(contrib(op, X, {"y": (2, 5, 16)}, consts, **attrs), tmp_path)


@pytest.mark.parametrize("trans_a,trans_b,alpha", [(0, 1, 0.5), (1, 0, 1.0), (1, 1, 2.0)])
def test_fused_matmul(tmp_path, trans_a, trans_b, alpha):
    a = (2, 3, 6, 4) if trans_a else (2, 3, 4, 6)
    b = (2, 3, 5, 6) if trans_b else (2, 3, 6, 5)
    check(contrib("FusedMatMul", {"a": (a, F)}, {"y": (2, 3, 4, 5)}, {"b": rand(*b)},
                  transA=trans_a, transB=trans_b, alpha=alpha), tmp_path)


@pytest.mark.parametrize("outputs", [1, 4])
def test_skip_layer_normalization(tmp_path, outputs):
    consts = {"skip": rand(2, 5, 16), "gamma": rand(16), "beta": rand(16), "bias": rand(16)}
    names = {"y": (2, 5, 16)}
    model = contrib("SkipLayerNormalization", X, names, consts, epsilon=1e-5)
    if outputs == 4:  # the input + skip + bias sum as a graph output too (the next block's residual)
        model.graph.node[0].output.extend(["", "", "sum"])
        model.graph.output.append(helper.make_tensor_value_info("sum", F, [2, 5, 16]))
    check(model, tmp_path)


def test_read_statistics_are_refused(tmp_path):
    # mean and inv_std_var are not computed (zeros stand in): a model that reads one is refused
    consts = {"skip": rand(2, 5, 16), "gamma": rand(16)}
    model = contrib("SkipLayerNormalization", X, {"y": (2, 5, 16)}, consts)
    model.graph.node[0].output.extend(["mean"])
    model.graph.output.append(helper.make_tensor_value_info("mean", F, None))
    assert unsupported_ops(model) == ["<unnamed> (SkipLayerNormalization whose mean/inv_std_var outputs are read)"]
    model = contrib("SimplifiedLayerNormalization", X, {"y": (2, 5, 16)}, {"scale": rand(16)}, domain="")
    model.graph.node[0].output.extend(["unread"])  # a second output nothing reads is fine
    check(model, tmp_path)


def test_skip_layer_normalization_without_beta_and_bias(tmp_path):
    check(contrib("SkipLayerNormalization", X, {"y": (2, 5, 16)}, {"skip": rand(2, 5, 16), "gamma": rand(16)}),
          tmp_path)


def test_rms_norms(tmp_path):
    check(contrib("SkipSimplifiedLayerNormalization", X, {"y": (2, 5, 16)},
                  {"skip": rand(2, 5, 16), "gamma": rand(16)}, epsilon=1e-6), tmp_path / "skip")
    check(contrib("SimplifiedLayerNormalization", X, {"y": (2, 5, 16)}, {"scale": rand(16)}, domain="",
                  axis=-1, epsilon=1e-6), tmp_path / "plain")


def test_bert_style_embedding_and_attention(tmp_path):
    """What onnxruntime's transformer optimizer makes of a BERT: EmbedLayerNormalization into
    com.microsoft's Attention (QKV in one weight), both converted by TVM's frontend itself."""
    ids = {"ids": ((2, 5), TensorProto.INT32), "segments": ((2, 5), TensorProto.INT32),
           "mask": ((2, 5), TensorProto.INT32)}
    embed = helper.make_node("EmbedLayerNormalization", ["ids", "segments", "words", "positions", "types", "gamma",
                                                        "beta", "mask"], ["emb", "mask_index"], domain=MS,
                             epsilon=1e-12)
    attention = helper.make_node("Attention", ["emb", "qkv", "qkv_bias", "mask_index"], ["y"], domain=MS,
                                 num_heads=2)
    consts = {"words": rand(7, 16), "positions": rand(9, 16), "types": rand(2, 16), "gamma": rand(16),
              "beta": rand(16), "qkv": rand(16, 48) * 0.3, "qkv_bias": rand(48)}
    graph = helper.make_graph(
        [embed, attention], "bert", [helper.make_tensor_value_info(n, t, list(s)) for n, (s, t) in ids.items()],
        [helper.make_tensor_value_info("y", F, [2, 5, 16])],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    check(model, tmp_path)


@pytest.mark.parametrize("mask,unidirectional", [(None, 0), (None, 1), ((2, 5), 0), ((2, 5, 5), 1)])
def test_attention_masks(tmp_path, mask, unidirectional):
    inputs = {"x": ((2, 5, 16), F)}
    if mask:  # random 0/1 masks (rows masked whole included)
        inputs["mask"] = (mask, TensorProto.INT32)
    node = helper.make_node("Attention", ["x", "qkv", "qkv_bias", *(["mask"] if mask else [])], ["y"], domain=MS,
                            num_heads=4, unidirectional=unidirectional)
    graph = helper.make_graph(
        [node], "att", [helper.make_tensor_value_info(n, t, list(s)) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info("y", F, [2, 5, 16])],
        [numpy_helper.from_array(rand(16, 48) * 0.3, "qkv"), numpy_helper.from_array(rand(48), "qkv_bias")])
    check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
          tmp_path)


@pytest.mark.parametrize("zero_points", ["none", "packed", "float"])
def test_matmul_nbits(tmp_path, zero_points):
    """4-bit weights in blocks of 16 along K (K = 40: the last block padded), as onnxruntime's
    4-bit quantizer writes them, dequantized at import."""
    rng = np.random.default_rng(1)
    k, n, block = 40, 24, 16
    blocks = -(-k // block)
    consts = {"b": rng.integers(0, 256, (n, blocks, block // 2)).astype(np.uint8),
              "scales": (rng.random(n * blocks) * 0.1 + 0.01).astype(np.float32)}
    if zero_points == "packed":
        consts["zp"] = rng.integers(0, 256, (n * -(-blocks // 2),)).astype(np.uint8)
    elif zero_points == "float":
        consts["zp"] = rng.integers(0, 16, (n * blocks,)).astype(np.float32)
    check(contrib("MatMulNBits", {"a": ((2, 3, k), F)}, {"y": (2, 3, n)}, consts, K=k, N=n, bits=4,
                  block_size=block), tmp_path)


@pytest.mark.parametrize("positions,interleaved", [("ids", 0), ("offset", 1)])
def test_rotary_embedding_is_com_microsofts_not_onnxs(tmp_path, positions, interleaved):
    # com.microsoft's RotaryEmbedding takes (input, position_ids, cos, sin); ONNX's, which
    # onnx_composites converts, (X, cos, sin, position_ids): the contrib node gets its own order
    pos = np.array([[0, 3, 1, 2], [5, 4, 6, 7]], np.int64) if positions == "ids" else np.array([2], np.int64)
    model = contrib("RotaryEmbedding", {"x": ((2, 4, 16), F)}, {"y": (2, 4, 16)},
                    {"pos": pos, "cos": rand(9, 4), "sin": rand(9, 4)}, num_heads=2, interleaved=interleaved)
    check(model, tmp_path)


def test_unknown_contrib_operators_are_named():
    model = contrib("GroupQueryAttention", X, {"y": (2, 5, 16)})
    assert unsupported_ops(model) == ["<unnamed> (GroupQueryAttention, com.microsoft opset 1)"]


@pytest.mark.parametrize("keys,bias,mask,attention_bias,unidirectional", [
    (5, True, "padding", False, 0),  # self-attention, projections' bias, [batch, keys] 1/0 mask
    (7, False, None, True, 0),  # cross-attention (7 keys for 5 queries), additive [1, heads, q, k] bias
    (5, False, "lengths", False, 1),  # [batch] key lengths, causal
])
def test_multi_head_attention(tmp_path, keys, bias, mask, attention_bias, unidirectional):
    s = 5
    inputs = {"q": ((2, s, 16), F), "k": ((2, keys, 16), F), "v": ((2, keys, 8), F)}
    names, consts = ["q", "k", "v", "", "", ""], {}
    if bias:
        consts["bias"], names[3] = rand(40), "bias"
    if mask == "padding":
        inputs["mask"], names[4] = ((2, keys), TensorProto.INT32), "mask"
    elif mask == "lengths":
        consts["lengths"], names[4] = np.array([3, 5], np.int32), "lengths"
    if attention_bias:
        consts["attn_bias"], names[5] = rand(1, 2, s, keys), "attn_bias"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain=MS, num_heads=2,
                            unidirectional=unidirectional)
    graph = helper.make_graph(
        [node], "mha", [helper.make_tensor_value_info(n, t, list(sh)) for n, (sh, t) in inputs.items()],
        [helper.make_tensor_value_info("y", F, [2, s, 8])], [numpy_helper.from_array(v, n) for n, v in consts.items()])
    check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
          tmp_path)


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm_is_the_lstm_with_its_weights_dequantized(tmp_path, per_channel):
    # what onnxruntime's quantize_dynamic makes of an LSTM (a CRNN's, ddddocr's int8 OCR model)
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic

    hidden, size, seq = 8, 6, 5
    names = ["x", "W", "R", "B"]
    consts = {"W": rand(2, 4 * hidden, size), "R": rand(2, 4 * hidden, hidden), "B": rand(2, 8 * hidden)}
    node = helper.make_node("LSTM", names, ["y", "y_h"], hidden_size=hidden, direction="bidirectional")
    graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", F, [seq, 2, size])],
                              [helper.make_tensor_value_info("y", F, [seq, 2, 2, hidden]),
                               helper.make_tensor_value_info("y_h", F, [2, 2, hidden])],
                              [numpy_helper.from_array(v, n) for n, v in consts.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "int8.onnx", weight_type=QuantType.QInt8,
                     per_channel=per_channel)
    quantized = onnx.load(tmp_path / "int8.onnx")
    (q_node,) = [n for n in quantized.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    for name, (q, scale, zero) in zip(("W", "R"), ((1, 8, 9), (2, 10, 11))):
        values, s, z = (inits[q_node.input[i]].astype(np.float32) for i in (q, scale, zero))
        shape = (2, 1, -1) if s.size > 1 else (1, 1, 1)
        dequantized = (values - z.reshape(shape)) * s.reshape(shape)  # [directions, rows, 4 hidden]
        graph.initializer.remove(next(i for i in graph.initializer if i.name == name))
        graph.initializer.append(numpy_helper.from_array(dequantized.transpose(0, 2, 1).copy(), name))
    dequantized_lstm = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    w, feeds, got = import_and_run(quantized, tmp_path)
    want = run_onnxruntime(dequantized_lstm, w.inputs, feeds)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    # and within the weights' rounding of the float LSTM. (onnxruntime also rounds x and h to
    # 8 bits at every step: 0.04 from the float LSTM per tensor here, 0.3 per channel)
    for g, r in zip(got, run_onnxruntime(onnx.load(tmp_path / "float.onnx"), w.inputs, feeds)):
        assert 0 < np.abs(g - r).max() < 0.1
