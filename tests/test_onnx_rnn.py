"""ONNX LSTM / GRU / RNN import as unrolled Relax ops and match onnxruntime (autofuse.onnx_rnn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx_import import import_and_run

from autofuse.importer import ModelError
from autofuse.importer import run_onnxruntime
from autofuse.importer import unsupported_ops
from autofuse.workload import prepare

SEQ, BATCH, INPUT, HIDDEN = 5, 2, 3, 4
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def rnn_model(
    op: str,
    direction: str = "forward",
    layout: int = 0,
    bias: bool = True,
    h0: bool = False,
    c0: bool = False,
    peepholes: bool = False,
    outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"),
    seq_lens: str | None = None,  # "full" / "short": an initializer; "input": a graph input
    **attrs: object,
) -> onnx.ModelProto:
    """One recurrent node with random weights; initial states are graph inputs."""
    rng = np.random.default_rng(0)
    g, d = GATES[op], 2 if direction == "bidirectional" else 1

    def weight(name: str, *shape: int, scale: float = 0.5) -> onnx.TensorProto:
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        return numpy_helper.from_array(value, name)

    inits = [weight("W", d, g * HIDDEN, INPUT), weight("R", d, g * HIDDEN, HIDDEN)]
    x_shape = [BATCH, SEQ, INPUT] if layout else [SEQ, BATCH, INPUT]
    state = [BATCH, d, HIDDEN] if layout else [d, BATCH, HIDDEN]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    names = ["x", "W", "R", ""]
    if bias:
        inits.append(weight("B", d, 2 * g * HIDDEN, scale=1.0))
        names[3] = "B"
    names.append("")
    if seq_lens in ("full", "short"):
        lens = np.full(BATCH, SEQ, np.int32)
        lens[-1] -= seq_lens == "short"
        inits.append(numpy_helper.from_array(lens, "lens"))
        names[4] = "lens"
    elif seq_lens == "input":
        graph_inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [BATCH]))
        names[4] = "lens"
    for name, wanted in (("h0", h0), ("c0", c0 and op == "LSTM")):
        if wanted:
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state))
        names.append(name if wanted else "")
    if op == "LSTM":
        names.append("")
        if peepholes:
            inits.append(weight("P", d, 3 * HIDDEN))
            names[7] = "P"
    while names[-1] == "":
        names.pop()
    kinds = ("Y", "Y_h", "Y_c")[: 3 if op == "LSTM" else 2]
    node_outputs = [k if k in outputs else "" for k in kinds]
    while node_outputs[-1] == "":
        node_outputs.pop()
    node = helper.make_node(
        op, names, node_outputs, name=f"the_{op.lower()}", hidden_size=HIDDEN,
        direction=direction, **attrs,
    )
    if layout:
        node.attribute.append(helper.make_attribute("layout", layout))
    y = [BATCH, SEQ, d, HIDDEN] if layout else [SEQ, d, BATCH, HIDDEN]
    shapes = {"Y": y, "Y_h": state, "Y_c": state}
    graph_outputs = [
        helper.make_tensor_value_info(k, TensorProto.FLOAT, shapes[k]) for k in node_outputs if k
    ]
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    return model


def check_against_onnxruntime(op: str, case: dict, tmp_path: Path) -> None:
    """Import `op` built with `case`, run the unfused plan, compare with onnxruntime.

    onnxruntime runs time-major nodes only, so a layout=1 node is checked against the same
    node (same weights) with layout 0, on transposed inputs and outputs."""
    model = rnn_model(op, **case)
    w, feeds, got = import_and_run(model, tmp_path)
    if case.get("layout"):
        time_major = rnn_model(op, **dict(case, layout=0))
        want = run_onnxruntime(time_major, w.inputs, [np.swapaxes(f, 0, 1) for f in feeds])
        want = [np.transpose(y, (2, 0, 1, 3)) if y.ndim == 4 else y.swapaxes(0, 1) for y in want]
    else:
        want = run_onnxruntime(model, w.inputs, feeds)
    assert len(got) == len(want) == len(model.graph.output)
    for g, x in zip(got, want):
        np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-5)


LSTM_CASES = [
    dict(),
    dict(direction="reverse", h0=True, c0=True),
    dict(direction="bidirectional", h0=True, c0=True, peepholes=True),
    dict(bias=False, outputs=("Y_h",)),
    dict(h0=True, peepholes=True, outputs=("Y_c", "Y"), clip=0.5),
    dict(layout=1, h0=True, c0=True, seq_lens="full"),
    dict(layout=1, direction="bidirectional", peepholes=True, h0=True, outputs=("Y_h", "Y_c")),
]


def case_id(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items()) or "default"


@pytest.mark.parametrize("case", LSTM_CASES, ids=case_id)
def test_lstm_matches_onnxruntime(case, tmp_path):
    check_against_onnxruntime("LSTM", case, tmp_path)


@pytest.mark.parametrize(
    "case",
    [
        dict(linear_before_reset=0, h0=True),
        dict(linear_before_reset=1),
        dict(linear_before_reset=1, direction="bidirectional", h0=True),
        dict(linear_before_reset=0, direction="reverse", bias=False, clip=0.4),
        dict(linear_before_reset=1, layout=1, h0=True, outputs=("Y_h",)),
    ],
    ids=case_id,
)
def test_gru_matches_onnxruntime(case, tmp_path):
    check_against_onnxruntime("GRU", case, tmp_path)


@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(direction="bidirectional", h0=True),
        dict(activations=["Relu"], bias=False),
        dict(direction="bidirectional", activations=["Tanh", "Relu"], h0=True),
    ],
    ids=case_id,
)
def test_rnn_matches_onnxruntime(case, tmp_path):
    check_against_onnxruntime("RNN", case, tmp_path)


def test_recurrent_ops_are_supported():
    for op in GATES:
        assert unsupported_ops(rnn_model(op)) == []


@pytest.mark.parametrize(
    "op, case, batches",
    [
        ("LSTM", dict(), 1),
        ("LSTM", dict(direction="bidirectional"), 1),
        ("GRU", dict(direction="bidirectional", linear_before_reset=0), 1),
        ("RNN", dict(direction="bidirectional", activations=["Tanh", "Relu"]), 2),
    ],
)
def test_unrolled_into_ordinary_kernels(op, case, batches, tmp_path):
    # one input projection for all steps, one recurrent matmul per step after the first (GRU
    # before reset: two), a bidirectional node's directions batched in each (at 16 steps of 96
    # hidden units an LSTM 1.07-1.10x faster, libraries paired) unless their activations differ; each gate a slice of
    # the step's pre-activations (fused into the gate's kernel), the steps one split of the
    # projection
    path = tmp_path / "rnn.onnx"
    onnx.save(rnn_model(op, **case), path)
    ops = [n.op for n in prepare(path, []).graph.nodes]
    per_step = 2 if op == "GRU" and not case.get("linear_before_reset") else 1
    assert sum(op.startswith("matmul") for op in ops) == batches * (1 + per_step * (SEQ - 1))
    assert sum(op.startswith("split") for op in ops) == batches


@pytest.mark.parametrize(
    "case, problem",
    [
        (dict(seq_lens="input"), "sequence_lens is not a constant"),
        (dict(seq_lens="short"), r"sequence_lens \[5, 4\] differs from the sequence length 5"),
        (dict(activations=["Sigmoid", "Elu", "Tanh"]), r"activation\(s\) \['Elu'\] not supported"),
        (dict(input_forget=1), "input_forget=1 .* is unsupported"),
    ],
)
def test_unsupported_cases_named(case, problem, tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save(rnn_model("LSTM", **case), path)
    with pytest.raises(ModelError, match=problem) as info:
        prepare(path, [], simplify=False)
    assert "\n" not in str(info.value) and "the_lstm" in str(info.value)
