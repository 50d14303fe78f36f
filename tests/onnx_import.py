"""Import a one-node ONNX test model the way autofuse does and run it: the shared half of the
converter tests (test_onnx_rnn, test_onnx_dft, test_onnx_attention), which then compare the
outputs with onnxruntime's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from autofuse import apply
from autofuse import build
from autofuse.importer import random_inputs
from autofuse.workload import Workload
from autofuse.workload import prepare


def import_and_run(
    model: onnx.ModelProto, tmp_path: Path, plan: str = "unfused", feeds: list | None = None
) -> tuple[Workload, list, list]:
    """(workload, feeds (random unless given), TVM's outputs) of `model` built with the `plan`
    ("unfused" or "tvm_default") on the CPU, unsimplified."""
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    w = prepare(path, [], simplify=False)
    target = build.make_target("llvm")
    ex = build.build(apply.apply_plan(w.mod, w.graph, getattr(w, plan)()), target)
    feeds = random_inputs(w.inputs) if feeds is None else feeds
    got: list[np.ndarray] = build.run(ex, build.device_for(target), feeds)
    return w, feeds, got


def check_against_onnxruntime(model: onnx.ModelProto, tmp_path: Path, feeds: list | None = None,
                              tol: float = 1e-5) -> tuple[Workload, list]:
    """(workload, TVM's outputs) of `model`, each output checked against onnxruntime's on the
    same inputs (shape, then values within `tol`)."""
    from autofuse.importer import run_onnxruntime

    tmp_path.mkdir(parents=True, exist_ok=True)
    w, feeds, got = import_and_run(model, tmp_path, feeds=feeds)
    want = run_onnxruntime(model, w.inputs, feeds)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        assert g.shape == e.shape
        np.testing.assert_allclose(g.astype("float64"), e.astype("float64"), rtol=tol, atol=tol)
    return w, got
