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

    def to_json(self) -> str:
        return tvm.ir.save_json(self.mod)


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
