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
        (dict(outputs=4, qk_matmul_output_mode=1), "qk_matmul_output_mode 1 is not supported"),
    ],
)
def test_unsupported_attention_is_named(case, problem, tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save(attention_model(**case), path)
    with pytest.raises(ModelError, match=problem) as info:
        prepare(path, [], simplify=False)
    assert "\n" not in str(info.value) and "the_attention" in str(info.value)
