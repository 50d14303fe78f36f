"""Shared fixtures: small workloads built by the tests themselves (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autofuse import models
from autofuse.workload import Workload
from autofuse.workload import prepare

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    for name in models.BUILTIN:
        models.write_builtin(name, out)
    return out


@pytest.fixture(scope="session")
def small() -> Workload:
    return prepare(HERE / "small_module.py")


@pytest.fixture(scope="session")
def conv_block(model_dir: Path) -> Workload:
    return prepare(model_dir / "conv_block.onnx")


@pytest.fixture(scope="session")
def transformer(model_dir: Path) -> Workload:
    return prepare(model_dir / "transformer_block.onnx")


@pytest.fixture(scope="session")
def mlp(model_dir: Path) -> Workload:
    return prepare(model_dir / "mlp.onnx")
