"""ONNX DFT imports as one matmul by a constant matrix and matches onnxruntime (autofuse.onnx_dft)."""

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
from autofuse.importer import unsupported_ops
from autofuse.onnx_dft import dft_matrix
from autofuse.onnx_dft import irfft_matrix
from autofuse.workload import prepare


def dft_model(
    shape: tuple[int, ...],
    axis: int | None = None,
    length: int | None = None,
    opset: int = 20,
    twice: bool = False,
    axis_as_graph_input: bool = False,
    **attrs: int,
) -> onnx.ModelProto:
    """One DFT node (two chained, the second along axis 1, with `twice`: a 2-D transform as
    FNet's), then the real part, as torch exports `fftn(x).real`."""
    inits, inputs = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    names = ["x", ""]
    if length is not None:
        inits.append(numpy_helper.from_array(np.array(length, np.int64), "len"))
        names[1] = "len"
    if opset >= 20 and (axis is not None or axis_as_graph_input):
        if axis_as_graph_input:
            inputs.append(helper.make_tensor_value_info("axis", TensorProto.INT64, []))
        else:
            inits.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
        names.append("axis")
    elif axis is not None:
        attrs = dict(attrs, axis=axis)
    while names[-1] == "":
        names.pop()
    nodes = [helper.make_node("DFT", names, ["y"], name="the_dft", **attrs)]
    last = "y"
    if twice:
        inits.append(numpy_helper.from_array(np.array(1, np.int64), "axis1"))
        second = ["y", "", "axis1"] if opset >= 20 else ["y"]
        nodes.append(helper.make_node("DFT", second, ["y2"], **({} if opset >= 20 else {"axis": 1})))
        last = "y2"
    inits.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
    nodes.append(helper.make_node("Gather", [last, "zero"], ["re"], axis=len(shape) - 1))
    outputs = [helper.make_tensor_value_info("re", TensorProto.FLOAT, [None] * (len(shape) - 1)),
               helper.make_tensor_value_info(last, TensorProto.FLOAT, [None] * len(shape))]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


CASES = [
    dict(shape=(2, 8, 6, 1)),  # opset 20's default axis -2: the last signal axis
    dict(shape=(2, 8, 6, 2), axis=1, inverse=1),
    dict(shape=(2, 8, 7, 1), axis=-2, onesided=1),
    dict(shape=(2, 8, 6, 1), axis=1, length=11),  # zero padded
    dict(shape=(2, 8, 6, 2), axis=1, length=5),  # truncated
    dict(shape=(3, 5, 1), opset=17),  # opset 17's default axis 1, an attribute
    dict(shape=(2, 4, 6, 1), axis=2, opset=17, twice=True),
    dict(shape=(1, 16, 32, 1), axis=2, twice=True),  # FNet: fftn over tokens and hidden, real part
]


def case_id(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dft_matches_onnxruntime(case, tmp_path):
    model = dft_model(**case)
    w, feeds, got = import_and_run(model, tmp_path)
    want = run_onnxruntime(model, w.inputs, feeds)
    assert [g.shape for g in got] == [x.shape for x in want]
    for g, x in zip(got, want):
        np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-4 * np.abs(x).max())


def test_dft_is_one_matmul_per_node(tmp_path):
    path = tmp_path / "dft.onnx"
    onnx.save(dft_model((1, 16, 32, 1), axis=2, twice=True), path)
    ops = [n.op for n in prepare(path, [], simplify=False).graph.nodes]
    assert sum(op.startswith("matmul") for op in ops) == 2
    assert unsupported_ops(dft_model((2, 8, 6, 1))) == []


def test_dft_matrix_is_the_transform():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(7) + 1j * rng.standard_normal(7)
    pairs = np.stack([x.real, x.imag], -1).reshape(-1)
    for inverse, want in ((False, np.fft.fft(x)), (True, np.fft.ifft(x))):
        got = (pairs @ dft_matrix(7, 7, onesided=False, inverse=inverse, complex_input=True)).reshape(-1, 2)
        np.testing.assert_allclose(got[:, 0] + 1j * got[:, 1], want, atol=1e-12)
    got = (x.real @ dft_matrix(7, 7, onesided=True, inverse=False, complex_input=False)).reshape(-1, 2)
    np.testing.assert_allclose(got[:, 0] + 1j * got[:, 1], np.fft.rfft(x.real), atol=1e-12)
    for length in (12, 11, 6, 15):  # irfft: even and odd lengths, bins dropped or zero padded
        spectrum = rng.standard_normal(7) + 1j * rng.standard_normal(7)
        pairs = np.stack([spectrum.real, spectrum.imag], -1).reshape(-1)
        np.testing.assert_allclose(pairs @ irfft_matrix(7, length), np.fft.irfft(spectrum, n=length), atol=1e-12)


@pytest.mark.parametrize(
    "case, problem",
    [
        (dict(shape=(2, 8, 6, 1), axis=1, inverse=1, onesided=1), "onesided is a forward transform of a real input"),
        (dict(shape=(2, 8, 6, 1), axis_as_graph_input=True), "axis is not a constant"),
        (dict(shape=(2, 8, 6, 3), axis=1), r"input shape \[2, 8, 6, 3\] has no last axis of 1"),
        (dict(shape=(1, 20000, 1), axis=1), "needs a 20000x40000 matrix, over 256 MiB"),
    ],
)
def test_unsupported_dfts_are_named(case, problem, tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save(dft_model(**case), path)
    with pytest.raises(ModelError, match=problem) as info:
        prepare(path, [], simplify=False)
    assert "\n" not in str(info.value) and "the_dft" in str(info.value)


def stft_model(signal: tuple[int, int, int], step: int, length: int | None, window: str | None,
               onesided: int = 1) -> onnx.ModelProto:
    """An STFT of `signal`'s shape; `window`: "hann" (a HannWindow node of `length`), "input"
    (a graph input) or None."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(signal))]
    inits = [numpy_helper.from_array(np.array(step, np.int64), "step")]
    nodes, names = [], ["x", "step", "", ""]
    if window == "hann":
        inits.append(numpy_helper.from_array(np.array(length, np.int64), "size"))
        nodes.append(helper.make_node("HannWindow", ["size"], ["window"]))
        names[2] = "window"
    elif window == "input":
        inputs.append(helper.make_tensor_value_info("window", TensorProto.FLOAT, [length]))
        names[2] = "window"
    if length is not None and window != "hann":
        inits.append(numpy_helper.from_array(np.array(length, np.int64), "length"))
        names[3] = "length"
    while names[-1] == "":
        names.pop()
    nodes.append(helper.make_node("STFT", names, ["y"], name="the_stft", onesided=onesided))
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, out, inits),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "case",
    [
        dict(signal=(2, 100, 1), step=10, length=16, window="hann"),
        dict(signal=(1, 64, 2), step=7, length=12, window=None, onesided=0),  # a complex signal
        dict(signal=(2, 50, 1), step=4, length=9, window="input"),  # a window computed at run time
    ],
    ids=case_id,
)
def test_stft_matches_onnxruntime(case, tmp_path):
    model = stft_model(**case)
    w, feeds, got = import_and_run(model, tmp_path)
    want = run_onnxruntime(model, w.inputs, feeds)
    assert got[0].shape == want[0].shape
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4 * np.abs(want[0]).max())


@pytest.mark.parametrize("kind", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_onnxruntime(kind, periodic, tmp_path):
    size = numpy_helper.from_array(np.array(10, np.int64), "size")
    node = helper.make_node(kind, ["size"], ["w"], periodic=periodic, output_datatype=TensorProto.DOUBLE)
    # the window times an input, so that the model has one to feed; onnxruntime computes the
    # coefficients in float32 (Hamming 2.4e-7 from the double-precision ones)
    nodes = [node, helper.make_node("Mul", ["w", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [10])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [10])], [size])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    w, feeds, got = import_and_run(model, tmp_path)
    np.testing.assert_allclose(got[0], run_onnxruntime(model, w.inputs, feeds)[0], rtol=1e-6, atol=1e-7)
