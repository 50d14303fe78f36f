import numpy as np
import pytest

from autofuse.cost_model import XGBCostModel
from autofuse.cost_model import kendall_tau
from autofuse.features import FEATURE_NAMES
from autofuse.features import RESOURCE_FEATURES
from autofuse.features import group_features
from autofuse.space import SearchSpace


def synthetic(rng, n):
    x = rng.uniform(0, 10, size=(n, len(FEATURE_NAMES)))
    # latency grows with FLOPs and bytes, shrinks with bytes kept inside the group
    i = {name: k for k, name in enumerate(FEATURE_NAMES)}
    y = 1e-6 * (2 ** (0.3 * x[:, i["log_flops"]]) + 2 ** (0.4 * x[:, i["log_bytes_in"]])
                - 0.5 * x[:, i["log_bytes_saved"]] + 10)
    return x, y


def test_learns_a_synthetic_latency_function(tmp_path):
    rng = np.random.default_rng(0)
    x, y = synthetic(rng, 400)
    model = XGBCostModel(min_samples=8, seed=0)
    for k, (row, lat) in enumerate(zip(x[:300], y[:300])):
        model.add(f"k{k}", row, lat)
    assert model.fit()
    pred = model.predict_groups(x[300:])
    rel = np.abs(pred - y[300:]) / y[300:]
    assert np.median(rel) < 0.1
    assert kendall_tau(pred, y[300:]) > 0.8
    model.overhead_s = 3e-6
    model.save(tmp_path / "cm.json")
    back = XGBCostModel.load(tmp_path / "cm.json")
    np.testing.assert_allclose(back.predict_groups(x[300:]), pred, rtol=1e-6)
    assert back.overhead_s == 3e-6


def test_plan_cost_uses_known_kernels_and_overhead():
    rng = np.random.default_rng(1)
    x, y = synthetic(rng, 50)
    model = XGBCostModel(min_samples=8)
    for k, (row, lat) in enumerate(zip(x, y)):
        model.add(f"k{k}", row, lat)
    model.fit()
    model.overhead_s = 1e-6
    rows = [x[0], x[1]]
    cost = model.plan_cost(rows, [5e-6, None])
    assert cost == pytest.approx(5e-6 + model.predict_groups([x[1]])[0] + 2e-6, rel=1e-9)
    assert model.plan_cost(rows, [5e-6, 7e-6]) == pytest.approx(5e-6 + 7e-6 + 2e-6)


def test_not_ready_until_enough_samples():
    model = XGBCostModel(min_samples=4)
    model.add("a", [0.0] * len(FEATURE_NAMES), 1e-6)
    assert not model.fit() and not model.ready
    model.add("a", [0.0] * len(FEATURE_NAMES), 2e-6)  # same kernel: replaced, not added
    assert len(model.samples) == 1


def test_group_features_shape_and_meaning(small, transformer):
    g = small.graph
    single = group_features(g, (2,), "llvm")
    fused = group_features(g, (1, 2, 3), "llvm")
    i = {name: k for k, name in enumerate(FEATURE_NAMES)}
    assert len(single) == len(FEATURE_NAMES)
    assert fused[i["ops"]] == 3 and fused[i["reductions_with_consumers"]] == 1
    assert fused[i["log_bytes_saved"]] > 0 and single[i["log_bytes_saved"]] == 0
    assert group_features(g, (4, 6), "cuda")[i["horizontal"]] == 1
    assert group_features(g, (4, 6), "cuda")[i["target_cuda"]] == 1
    space = SearchSpace(transformer.graph)
    plan = space.plan_of_kinds({"vertical", "horizontal", "reduction"})
    for grp in plan.groups:
        row = group_features(transformer.graph, grp, "llvm")
        assert all(np.isfinite(row[: -RESOURCE_FEATURES]))
        assert row[-RESOURCE_FEATURES:] == [None] * RESOURCE_FEATURES  # unknown until built for CUDA
    built = group_features(g, (4, 6), "cuda", {"registers": 40, "spill_bytes": 0, "smem_bytes": 1024, "stack_bytes": 0})
    assert built[i["gpu_registers"]] == 40 and built[i["log_gpu_smem_bytes"]] > 0


def test_model_trains_and_predicts_with_missing_resource_features(small):
    model = XGBCostModel(min_samples=4)
    rng = np.random.default_rng(0)
    groups = [(0,), (1,), (2,), (3,), (4,), (1, 2), (4, 6)]
    for k, grp in enumerate(groups):
        res = {"registers": 30 + k, "spill_bytes": 0, "smem_bytes": 0, "stack_bytes": 0} if k % 2 else None
        model.add(f"k{k}", group_features(small.graph, grp, "cuda", res), 1e-5 * (1 + rng.random()))
    model.add("old_row", [1.0] * 21, 1e-5)  # a row logged before the resource features existed
    assert model.fit()
    pred = model.predict_groups([group_features(small.graph, (0,), "cuda")])
    assert pred.shape == (1,) and np.isfinite(pred).all()
