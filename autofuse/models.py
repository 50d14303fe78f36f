"""Built-in demo models, written as ONNX graphs with seeded random weights (no download).

They exercise all three fusion kinds: conv anchors with BatchNorm/ReLU/residual epilogues
(vertical), sibling Q/K/V projections (horizontal), and softmax and layer-norm written as
primitive reduce/elementwise ops (reduction -> broadcast), as older exporters emit them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

OPSET = 17


class _Graph:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, value: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, shape: tuple[int, ...], scale: float | None = None) -> str:
        scale = scale if scale is not None else 1.0 / np.sqrt(max(1, int(np.prod(shape[1:]))))
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def model(
        self, name: str, inputs: dict[str, tuple[int, ...]], output: str, out_shape: tuple[int, ...]
    ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, list(out_shape))],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model

    def layer_norm(self, x: str, dim: int) -> str:
        mean = self.op("ReduceMean", [x], axes=[-1], keepdims=1)
        centred = self.op("Sub", [x, mean])
        var = self.op("ReduceMean", [self.op("Mul", [centred, centred])], axes=[-1], keepdims=1)
        std = self.op("Sqrt", [self.op("Add", [var, self.const(np.float32(1e-5))])])
        normed = self.op("Div", [centred, std])
        gamma = self.const((1 + 0.1 * self.rng.standard_normal(dim)).astype(np.float32))
        return self.op("Add", [self.op("Mul", [normed, gamma]), self.weight((dim,), 0.1)])

    def softmax(self, x: str) -> str:
        shifted = self.op("Sub", [x, self.op("ReduceMax", [x], axes=[-1], keepdims=1)])
        e = self.op("Exp", [shifted])
        return self.op("Div", [e, self.op("ReduceSum", [e, self.const(np.array([-1]))], keepdims=1)])

    def linear(self, x: str, d_in: int, d_out: int) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.weight((d_in, d_out))]), self.weight((d_out,), 0.1)])

    def conv_bn_relu(self, x: str, c_in: int, c_out: int, relu: bool = True) -> str:
        y = self.op("Conv", [x, self.weight((c_out, c_in, 3, 3))], pads=[1, 1, 1, 1])
        bn = [
            self.const((1 + 0.1 * self.rng.standard_normal(c_out)).astype(np.float32)),
            self.weight((c_out,), 0.1),
            self.weight((c_out,), 0.1),
            self.const((0.5 + self.rng.random(c_out)).astype(np.float32)),
        ]
        y = self.op("BatchNormalization", [y, *bn])
        return self.op("Relu", [y]) if relu else y


def conv_block(seed: int = 0, channels: int = 16, size: int = 16, classes: int = 10) -> onnx.ModelProto:
    """conv-bn-relu, a residual conv-bn-relu-add block, global pool, linear, softmax."""
    g = _Graph(seed)
    h = g.conv_bn_relu("x", 3, channels)
    r = g.conv_bn_relu(g.conv_bn_relu(h, channels, channels), channels, channels, relu=False)
    h = g.op("Relu", [g.op("Add", [r, h])])
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [h])], axis=1)
    logits = g.op("Gemm", [pooled, g.weight((classes, channels)), g.weight((classes,), 0.1)], transB=1)
    return g.model("conv_block", {"x": (1, 3, size, size)}, g.softmax(logits), (1, classes))


def transformer_block(seed: int = 0, seq: int = 32, dim: int = 64, heads: int = 4) -> onnx.ModelProto:
    """A pre-norm encoder block with layer-norm and softmax written as primitive ops."""
    g = _Graph(seed)
    hd = dim // heads
    ln = g.layer_norm("x", dim)

    def split_heads(t: str) -> str:
        t = g.op("Reshape", [t, g.const(np.array([1, seq, heads, hd]))])
        return g.op("Transpose", [t], perm=[0, 2, 1, 3])

    q, k, v = (split_heads(g.linear(ln, dim, dim)) for _ in range(3))
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          g.const(np.float32(1.0 / np.sqrt(hd)))])
    ctx = g.op("MatMul", [g.softmax(scores), v])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.const(np.array([1, seq, dim]))])
    h = g.op("Add", ["x", g.linear(ctx, dim, dim)])
    ff = g.op("Relu", [g.linear(g.layer_norm(h, dim), dim, 4 * dim)])
    out = g.op("Add", [h, g.linear(ff, 4 * dim, dim)])
    return g.model("transformer_block", {"x": (1, seq, dim)}, out, (1, seq, dim))


def mlp(seed: int = 0, batch: int = 8, dims: tuple[int, ...] = (64, 128, 128, 10)) -> onnx.ModelProto:
    """Linear-ReLU layers and a softmax head."""
    g = _Graph(seed)
    h = "x"
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        h = g.linear(h, a, b)
        if i < len(dims) - 2:
            h = g.op("Relu", [h])
    return g.model("mlp", {"x": (batch, dims[0])}, g.softmax(h), (batch, dims[-1]))


BUILTIN: dict[str, Callable[[], onnx.ModelProto]] = {
    "transformer_block": transformer_block,
    "conv_block": conv_block,
    "mlp": mlp,
}
DEFAULT_MODEL = "transformer_block"


def write_builtin(name: str, directory: str | Path) -> Path:
    """Save built-in model `name` as ONNX under `directory`; returns its path."""
    if name not in BUILTIN:
        raise KeyError(f"no built-in model {name!r}; choose from {sorted(BUILTIN)}")
    path = Path(directory) / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(BUILTIN[name](), str(path))
    return path
