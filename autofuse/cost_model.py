"""XGBoost cost model: predicts each fused group's kernel latency from its features.

A plan's predicted cost is the sum over its groups plus a per-kernel overhead (launch, VM
dispatch), fitted from whole-plan measurements. Groups whose kernel was already measured use the
measured time instead of a prediction. Training data are (features, latency) of kernels keyed by
their structural hash and target, so the same kernel met in many plans counts once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from autofuse.features import FEATURE_NAMES


class XGBCostModel:
    """Regressor on log2(latency) of single kernels.

    Args:
        min_samples: kernels needed before the model predicts (`ready`).
        seed: makes training repeatable.
    """

    def __init__(self, min_samples: int = 8, seed: int = 0) -> None:
        self.min_samples = min_samples
        self.seed = seed
        self.samples: dict[str, tuple[list[float], float]] = {}  # kernel hash -> (x, latency)
        self.overhead_s = 0.0
        self._booster = None  # xgboost.Booster once trained
        self._trained_on = 0

    @property
    def ready(self) -> bool:
        return self._booster is not None

    def add(self, kernel: str, features: Sequence[float | None], latency_s: float) -> None:
        """One measured kernel. Missing features (None, or rows logged before a feature existed)
        are NaN, which XGBoost treats as missing."""
        if latency_s > 0 and math.isfinite(latency_s):
            row = _row(features)
            self.samples[kernel] = (row, float(latency_s))

    def fit(self) -> bool:
        """Retrain on all samples if there are new ones; returns whether the model is ready."""
        n = len(self.samples)
        if n < self.min_samples or n == self._trained_on:
            return self.ready
        import xgboost as xgb

        x = np.array([s[0] for s in self.samples.values()], dtype=np.float64)
        y = np.log2(np.array([s[1] for s in self.samples.values()]) * 1e6)
        params = {
            "objective": "reg:squarederror",
            "max_depth": 6,
            "eta": 0.1,
            "subsample": 1.0,
            "min_child_weight": 1.0,
            "seed": self.seed,
            "nthread": 1,
        }
        rounds = min(300, 40 + 4 * n)
        self._booster = xgb.train(params, xgb.DMatrix(x, label=y, feature_names=list(FEATURE_NAMES)), rounds)
        self._trained_on = n
        return True

    def predict_groups(self, rows: Sequence[Sequence[float]]) -> np.ndarray:
        """Predicted kernel latencies in seconds."""
        if not self.ready:
            raise RuntimeError("cost model not trained yet")
        import xgboost as xgb

        x = np.array([_row(r) for r in rows], dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES))
        pred = self._booster.predict(xgb.DMatrix(x, feature_names=list(FEATURE_NAMES)))  # type: ignore[union-attr]
        return np.exp2(pred) / 1e6

    def plan_cost(self, rows: Sequence[Sequence[float]], known_s: Sequence[float | None]) -> float:
        """Predicted plan latency: measured kernel time where known, else the model's."""
        unknown = [r for r, k in zip(rows, known_s) if k is None]
        pred = iter(self.predict_groups(unknown)) if unknown else iter(())
        total = sum(k if k is not None else float(next(pred)) for k in known_s)
        return total + self.overhead_s * len(rows)

    def fit_overhead(self, pairs: Sequence[tuple[float, float, int]]) -> None:
        """Per-kernel overhead from (measured plan latency, sum of kernel times, kernels)."""
        per_kernel = [(m - s) / k for m, s, k in pairs if k > 0]
        if per_kernel:
            self.overhead_s = max(0.0, float(np.median(per_kernel)))

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "features": list(FEATURE_NAMES),
            "overhead_s": self.overhead_s,
            "samples": len(self.samples),
            "min_samples": self.min_samples,
        }
        if self._booster is not None:
            self._booster.save_model(str(path.with_suffix(".ubj")))
        path.write_text(json.dumps(meta, indent=1))

    @staticmethod
    def load(path: str | Path) -> XGBCostModel:
        import xgboost as xgb

        path = Path(path)
        meta = json.loads(path.read_text())
        if meta.get("features") != list(FEATURE_NAMES):
            raise ValueError(f"{path}: cost model was trained on other features")
        model = XGBCostModel(min_samples=int(meta.get("min_samples", 8)))
        model.overhead_s = float(meta.get("overhead_s", 0.0))
        booster_path = path.with_suffix(".ubj")
        if booster_path.exists():
            model._booster = xgb.Booster()
            model._booster.load_model(str(booster_path))
        return model


def kendall_tau(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Rank agreement between predicted and measured plan latencies (None if < 3 pairs)."""
    if len(predicted) < 3:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau(predicted, measured).statistic
    return None if tau is None or math.isnan(tau) else float(tau)


def _row(features: Sequence[float | None]) -> list[float]:
    row = [math.nan if f is None else float(f) for f in features][: len(FEATURE_NAMES)]
    return row + [math.nan] * (len(FEATURE_NAMES) - len(row))
