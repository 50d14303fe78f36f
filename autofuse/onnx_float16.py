"""Half-precision ONNX models computed in float32 on CPU targets, as onnxruntime does.

x86 CPUs without AVX512-FP16 have no half-precision arithmetic: LLVM converts each operand to
float32 and every result back, one element at a time, and a float16 BERT ran 2.3x slower than
onnxruntime here (2,977 us against 1,279). onnxruntime's CPU provider inserts casts around the
operators it has no float16 kernel for and computes them in float32; this does the same for the
whole graph before import. The model keeps its interface: float16 inputs are cast up where they
enter and float16 outputs cast back where they leave, so a deployed library takes and returns
what the original model did. Weights become float32 (twice the memory, the price of fast
arithmetic; the CPU's caches see them once per inference either way).

Only the types change: float16/bfloat16 initializers, constants and Cast/dtype attributes become
float32, in subgraphs too. A model without half-precision types is returned untouched (same
bytes, so the workload keys of float32 models do not move).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from autofuse.onnx_rewrite import rename_inputs

HALF = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
# node attributes naming an output element type (Cast's `to`, EyeLike's and the random
# generators' `dtype`, DequantizeLinear's `output_dtype`)
_TYPE_ATTRS = ("to", "dtype", "output_dtype")


def half_types(model: onnx.ModelProto) -> set[str]:
    """The half-precision types `model` declares anywhere (tensors, types, Cast targets)."""
    return {HALF[t] for t in _halves(model.graph, retype=False)}


def upcast(model: onnx.ModelProto) -> tuple[onnx.ModelProto, set[str]]:
    """(`model` computing in float32 with its interface kept, the half types it replaced)."""
    halves = half_types(model)
    if not halves:
        return model, halves
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _halves(out.graph, retype=True)
    _keep_interface(out.graph, model.graph)
    return out, halves


def _halves(g: onnx.GraphProto, retype: bool) -> set[int]:
    """The half element types `g` and its subgraphs declare (initializers, value types, tensor
    attributes, Cast/dtype attributes); with `retype`, each of them made float32 on the way."""
    found: set[int] = set()
    for i, t in enumerate(g.initializer):
        if t.data_type in HALF:
            found.add(t.data_type)
            if retype:
                g.initializer[i].CopyFrom(_float32_tensor(t))
    for v in list(g.input) + list(g.output) + list(g.value_info):
        tt = v.type.tensor_type
        if tt.elem_type in HALF:
            found.add(tt.elem_type)
            if retype:
                tt.elem_type = TensorProto.FLOAT
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.INT and a.name in _TYPE_ATTRS and a.i in HALF:
                found.add(a.i)
                if retype:
                    a.i = TensorProto.FLOAT
            elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type in HALF:
                found.add(a.t.data_type)
                if retype:
                    a.t.CopyFrom(_float32_tensor(a.t))
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                found |= _halves(sub, retype)
    return found


def _float32_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)


def _keep_interface(g: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """Casts at the graph's edges so its inputs and outputs keep their original half types.

    A half input `x` is read everywhere as `x__float32`, a Cast of it; a half output `y` is
    computed as `y__float32` (its producing node's output or initializer renamed, and every
    use) and cast back to `y` last. An output that is an input passes through untouched.
    """
    weights = {t.name for t in g.initializer}
    inputs = {i.name for i in g.input}
    renamed: dict[str, str] = {}
    casts_in, casts_out = [], []
    for now, was in zip(g.input, original.input):
        elem = was.type.tensor_type.elem_type
        if elem in HALF and now.name not in weights:  # (an IR<4 model lists its weights as inputs)
            now.type.tensor_type.elem_type = elem
            renamed[now.name] = f"{now.name}__float32"
            casts_in.append(helper.make_node("Cast", [now.name], [renamed[now.name]], to=TensorProto.FLOAT,
                                             name=f"{now.name}__upcast"))
    for now, was in zip(g.output, original.output):
        elem = was.type.tensor_type.elem_type
        if elem not in HALF:
            continue
        now.type.tensor_type.elem_type = elem
        if now.name in inputs:
            continue
        renamed[now.name] = f"{now.name}__float32"
        casts_out.append(helper.make_node("Cast", [renamed[now.name]], [now.name], to=elem,
                                          name=f"{now.name}__downcast"))
    outputs = {k: v for k, v in renamed.items() if k not in inputs}
    for t in list(g.initializer) + list(g.value_info):
        t.name = outputs.get(t.name, t.name)
    for node in g.node:
        rename_inputs(node, renamed)
        for k, name in enumerate(node.output):
            node.output[k] = outputs.get(name, name)
    nodes = casts_in + list(g.node) + casts_out
    del g.node[:]
    g.node.extend(nodes)
