"""ONNX Attention (opset 23) imports as matmul/softmax ops and matches onnxruntime (autofuse.onnx_attention)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import import_and_run

from autofuse.importer import ModelError
from autofuse.importer import run_onnxruntime
from autofuse.workload import prepare

B, Q_LEN, KV_LEN, PAST, HEAD = 2, 5, 5, 3, 8


def attention_model(
    q_heads: int = 4,
    kv_heads: int = 4,
    three_d: bool = False,
    mask: str | None = None,  # "bool", "float", "short" (float, fewer columns than keys)
    past: bool = False,
    outputs: int = 1,
    **attrs: object,
) -> onnx.ModelProto:
    """One Attention node over graph inputs; a mask is a constant."""
    rng = np.random.default_rng(0)

    def shape(heads: int, seq: int) -> list[int]:
        return [B, seq, heads * HEAD] if three_d else [B, heads, seq, HEAD]

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape(h, s))
              for n, h, s in (("q", q_heads, Q_LEN), ("k", kv_heads, KV_LEN), ("v", kv_heads, KV_LEN))]
    names, inits = ["q", "k", "v"], []
    total = KV_LEN + (PAST if past else 0)
    if mask:
        cols = total - 2 if mask == "short" else total
        value = rng.random((Q_LEN, cols)) > 0.3 if mask == "bool" else rng.standard_normal((1, q_heads, Q_LEN, cols))
        if mask == "bool":
            value[:, 0] = True  # no row fully masked
        inits.append(numpy_helper.from_array(value.astype(np.bool_ if mask == "bool" else np.float32), "mask"))
        names.append("mask")
    if past:
        names += [""] * (4 - len(names)) + ["past_k", "past_v"]
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, kv_heads, PAST, HEAD])
                   for n in ("past_k", "past_v")]
    if three_d:
        attrs = dict(attrs, q_num_heads=q_heads, kv_num_heads=kv_heads)
    outs = ["y", "present_k", "present_v", "qk"][:outputs]
    node = helper.make_node("Attention", names, outs, name="the_attention", **attrs)
    graph_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None if three_d else [None] * 4)
                     for n in outs]
    if three_d:
        graph_outputs[0] = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 3)
    graph = helper.make_graph([node], "g", inputs, graph_outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


CASES = [
    dict(),
    dict(three_d=True, q_heads=4, kv_heads=2),  # grouped-query heads
    dict(is_causal=1, q_heads=4, kv_heads=1),
    dict(mask="bool", scale=0.3),
    dict(mask="float", softcap=2.0),
    dict(mask="short"),  # padded with -inf up to the keys
    dict(past=True, is_causal=1, outputs=3),  # the causal diagonal offset by the cache
    dict(past=True, mask="bool", outputs=4, qk_matmul_output_mode=3),
]


def case_id(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items()) or "default"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_attention_matches_onnxruntime(case, tmp_path):
    model = attention_model(**case)
    w, feeds, got = import_and_run(model, tmp_path, "tvm_default")
    if case.get("mask") == "short":  # onnxruntime requires a mask as long as the keys: ONNX's reference
        from onnx.reference import ReferenceEvaluator

        want = ReferenceEvaluator(model).run(None, {i.name: f for i, f in zip(w.inputs, feeds)})
    else:
        want = run_onnxruntime(model, w.inputs, feeds)
    assert len(got) == len(want) == case.get("outputs", 1)
    for g, x in zip(got, want):
        np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-5)


def test_attention_is_one_chain_of_matmul_softmax_matmul(tmp_path):
    path = tmp_path / "attention.onnx"
    onnx.save(attention_model(is_causal=1), path)
    ops = [n.op for n in prepare(path, [], simplify=False).graph.nodes]
    assert sum(op.startswith("matmul") for op in ops) == 2 and sum("softmax" in op for op in ops) == 1


@pytest.mark.parametrize(
    "case, problem",
    [
        (dict(q_heads=3, kv_heads=2), "3 query heads are no multiple of 2 key/value heads"),
        (dict(outputs=4, qk_matmul_output_mode=5), "qk_matmul_output_mode 5 is not one of 0-3"),
    ],
)
def test_unsupported_attention_is_named(case, problem, tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save(attention_model(**case), path)
    with pytest.raises(ModelError, match=problem) as info:
        prepare(path, [], simplify=False)
    assert "\n" not in str(info.value) and "the_attention" in str(info.value)


def _reference(model: onnx.ModelProto, feeds: dict) -> list:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def _runtime_inputs_model(opset: int, mask_rows: int | None = None, nonpad: bool = False,
                          outputs: int = 1, **attrs: object) -> onnx.ModelProto:
    """4-D Attention whose boolean mask or nonpad_kv_seqlen is a graph input (decided at run
    time, as a serving model's padding is)."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, [B, 2, Q_LEN if n == "q" else KV_LEN, HEAD]) for n in "qkv"]
    names = ["q", "k", "v"]
    if mask_rows is not None:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [mask_rows, KV_LEN]))
        names.append("mask")
    if nonpad:
        inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT64, [B]))
        names += [""] * (6 - len(names)) + ["lengths"]
    outs = ["y", "present_k", "present_v", "qk"][:outputs]
    node = helper.make_node("Attention", names, outs, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(n, f, None) for n in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("attrs", [{"is_causal": 1, "left_window_size": 2},
                                   {"left_window_size": 1, "right_window_size": 2}])
def test_sliding_window_attention(attrs, tmp_path):
    """Opset 25's local attention: keys within left/right of the query's position only."""
    model = _runtime_inputs_model(25, **attrs)
    w, feeds, got = import_and_run(model, tmp_path)
    want = _reference(model, {i.name: f for i, f in zip(w.inputs, feeds)})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_a_fully_masked_row_gives_zeros_not_nan(tmp_path):
    """The mask arrives at run time: which rows no key may attend to is found in the kernel."""
    model = _runtime_inputs_model(24, mask_rows=Q_LEN, outputs=4, qk_matmul_output_mode=3)
    mask = np.random.default_rng(1).random((Q_LEN, KV_LEN)) > 0.4
    mask[1] = False  # row 1 attends to nothing
    mask[3, 0] = True
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((B, 2, Q_LEN, HEAD), dtype="float32"),
             rng.standard_normal((B, 2, KV_LEN, HEAD), dtype="float32"),
             rng.standard_normal((B, 2, KV_LEN, HEAD), dtype="float32"), mask]
    w, _, got = import_and_run(model, tmp_path, feeds=feeds)
    want = _reference(model, {i.name: f for i, f in zip(w.inputs, feeds)})
    assert not np.isnan(got[0]).any() and (got[0][:, :, 1] == 0).all()
    for g, x in zip(got, want):
        np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
def test_external_cache_lengths_at_run_time(causal, tmp_path):
    """nonpad_kv_seqlen (opset 24): batch b holds lengths[b] valid keys, the queries its last."""
    model = _runtime_inputs_model(24, nonpad=True, is_causal=causal)
    rng = np.random.default_rng(2)
    feeds = [rng.standard_normal((B, 2, s, HEAD), dtype="float32") for s in (Q_LEN, KV_LEN, KV_LEN)]
    feeds.append(np.array([KV_LEN, KV_LEN - 1], "int64")[:B])
    w, _, got = import_and_run(model, tmp_path, feeds=feeds)
    want = _reference(model, {i.name: f for i, f in zip(w.inputs, feeds)})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_qk_output_with_the_mask_added(tmp_path):
    model = attention_model(mask="float", softcap=2.0, outputs=4, qk_matmul_output_mode=2)
    w, feeds, got = import_and_run(model, tmp_path)
    want = _reference(model, {i.name: f for i, f in zip(w.inputs, feeds)})
    for g, x in zip(got, want):
        np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-5)
