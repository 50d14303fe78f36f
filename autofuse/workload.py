"""A workload: one normalised model with its operator graph, inputs and identity key.

This is the unit tuning works on. The key is the structural hash of the normalised module plus
the input shapes and dtypes, so a plan found for one workload is never applied to another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import tvm

from autofuse import tvm_bridge
from autofuse.graph import OpGraph
from autofuse.importer import InputSpec
from autofuse.importer import LoadedModel
from autofuse.importer import ModelError
from autofuse.importer import load_model
from autofuse.plan import FusionPlan


@dataclass
class Workload:
    name: str
    mod: tvm.IRModule  # normalised (legalized) Relax
    graph: OpGraph
    inputs: tuple[InputSpec, ...]
    key: str
    loaded: LoadedModel
    _tvm_default: FusionPlan | None = field(default=None, repr=False)

    def tvm_default(self) -> FusionPlan:
        """TVM FuseOps' own plan for this workload (FuseOps runs once, on first use)."""
        if self._tvm_default is None:
            self._tvm_default = tvm_bridge.fuseops_plan(self.mod, self.graph)
        return self._tvm_default

    def unfused(self) -> FusionPlan:
        return FusionPlan.unfused(self.graph)

    def save(self, directory: str | Path) -> None:
        """Write the module for a measurement worker to `load_module`: its structure as TVM's
        JSON, its weights apart in TVM's binary parameter format (tvm_bridge.detach_weights)."""
        mod, weights = tvm_bridge.detach_weights(self.mod)
        Path(directory, MODULE_FILE).write_text(tvm.ir.save_json(mod))
        if weights:
            Path(directory, WEIGHTS_FILE).write_bytes(tvm.runtime.save_param_dict(weights))


MODULE_FILE = "module.json"
WEIGHTS_FILE = "weights.params"


def load_module(directory: str | Path) -> tvm.IRModule:
    """The module `Workload.save` wrote to `directory`."""
    mod = tvm.ir.load_json(Path(directory, MODULE_FILE).read_text())
    weights = Path(directory, WEIGHTS_FILE)
    if not weights.exists():
        return mod
    return tvm_bridge.attach_weights(mod, dict(tvm.runtime.load_param_dict(weights.read_bytes())))


def weights_bytes(directory: str | Path) -> int:
    """Size of the weights `Workload.save` wrote to `directory` (0 without any)."""
    weights = Path(directory, WEIGHTS_FILE)
    return weights.stat().st_size if weights.exists() else 0


def workload_key(mod: tvm.IRModule, inputs: Sequence[InputSpec]) -> str:
    """Structural hash of the normalised module plus input shapes and dtypes (not names, which
    frontends may sanitise differently)."""
    shapes = ";".join(f"{'x'.join(map(str, s.shape))}:{s.dtype}" for s in inputs)
    text = tvm_bridge.structural_key(mod) + "|" + shapes
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prepare(
    source: str | Path | tvm.IRModule,
    inputs: Sequence[InputSpec] = (),
    name: str | None = None,
    simplify: bool = True,
    target: str = "llvm",
) -> Workload:
    """Import, normalise and analyse a model for `target`: everything tuning needs, computed once.

    On CPU targets an ONNX model's float16 arithmetic is imported as float32 (onnx_float16), so
    one float16 model makes different workloads (keys) for the CPU and for CUDA."""
    from autofuse.build import make_target

    upcast = make_target(target).kind.name != "cuda"
    loaded = load_model(source, inputs, simplify=simplify, upcast_half=upcast)
    mod = tvm_bridge.normalize(loaded.mod, loaded.notes)
    left = tvm_bridge.unlowered_ops(mod)
    if left:
        raise ModelError(f"{loaded.source}: TVM has no kernel for operator(s) {', '.join(left)}")
    graph = tvm_bridge.extract_graph(mod)
    if name is None:
        name = Path(str(source)).stem if not isinstance(source, tvm.IRModule) else "module"
    return Workload(name, mod, graph, loaded.inputs, workload_key(mod, loaded.inputs), loaded)
