"""ONNX recurrent operators (LSTM, GRU, RNN) as unrolled Relax ops.

TVM's Relax ONNX frontend has no converter for them, so models with a recurrent layer would not
import. Shapes are static in autofuse (the importer fixes input shapes), so the sequence length
is known and the recurrence is unrolled: each time step's matmul and gate elementwise ops become
ordinary kernels that LegalizeOps and the fusion search see like any others. As in ONNX
Runtime, the input projection X*W^T (plus the biases) is one matmul over all steps; only H*R^T
stays per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tvm import relax

from autofuse.onnx_converters import array_const
from autofuse.onnx_converters import converter
from autofuse.onnx_converters import is_const
from autofuse.onnx_converters import optional_input
from autofuse.onnx_converters import static_shape
from autofuse.onnx_converters import text

Activation = Callable[[relax.Expr], relax.Expr]

# supported ONNX activations, by lower-case name (ONNX spells them Sigmoid, Tanh, Relu)
_ACTIVATIONS: dict[str, Activation] = {
    "sigmoid": relax.op.sigmoid,
    "tanh": relax.op.tanh,
    "relu": relax.op.nn.relu,
}
_DIRECTIONS = {
    "forward": ("forward",),
    "reverse": ("reverse",),
    "bidirectional": ("forward", "reverse"),
}


@dataclass(frozen=True)
class _Cell:
    """What differs between the three operators' signatures."""

    op: str
    gates: int  # gate blocks stacked in W and R
    activations: tuple[str, ...]  # ONNX defaults, one set per direction


_LSTM = _Cell("LSTM", 4, ("Sigmoid", "Tanh", "Tanh"))  # gate blocks i, o, f, c
_GRU = _Cell("GRU", 3, ("Sigmoid", "Tanh"))  # gate blocks z, r, h
_RNN = _Cell("RNN", 1, ("Tanh",))


@dataclass(frozen=True)
class _Node:
    """One recurrent node's attributes, checked."""

    hidden: int
    directions: tuple[str, ...]  # "forward" / "reverse", in output order
    layout: int  # 0: time-major tensors, 1: batch-major
    clip: float | None
    acts: tuple[tuple[Activation, ...], ...]  # per direction
    linear_before_reset: bool  # GRU only


def _error(cell: _Cell, name: str, problem: str) -> ValueError:
    return ValueError(f"{cell.op} node {name!r}: {problem}")




def _parse(cell: _Cell, inputs: list, attr: dict, params: list) -> _Node:
    """The node's attributes, or a one-line error naming the node and what is unsupported."""
    name = str(attr["tvm_custom"]["name"] or "<unnamed>")
    direction = text(attr.get("direction", b"forward"))
    if direction not in _DIRECTIONS:
        raise _error(cell, name, f"unknown direction {direction!r}")
    dirs = _DIRECTIONS[direction]
    layout = int(attr.get("layout", 0))
    if layout not in (0, 1):
        raise _error(cell, name, f"unknown layout {layout}")
    if cell is _LSTM and int(attr.get("input_forget", 0)):
        raise _error(cell, name, "input_forget=1 (coupled input and forget gates) is unsupported")
    n = len(cell.activations)
    names = [text(a) for a in attr.get("activations", ())] or list(cell.activations) * len(dirs)
    if len(names) == n and len(dirs) == 2:
        names *= 2  # one set given for both directions
    if len(names) != n * len(dirs):
        raise _error(cell, name, f"expected {n * len(dirs)} activations, got {names}")
    unknown = sorted({a for a in names if a.lower() not in _ACTIVATIONS})
    if unknown:
        known = ", ".join(a.capitalize() for a in _ACTIVATIONS)
        raise _error(cell, name, f"activation(s) {unknown} not supported (only {known})")
    acts = tuple(
        tuple(_ACTIVATIONS[a.lower()] for a in names[d * n : (d + 1) * n])
        for d in range(len(dirs))
    )
    x_shape, r_shape = static_shape(inputs[0]), static_shape(inputs[2])
    if x_shape is None or r_shape is None:
        raise _error(cell, name, "X and R need static shapes to unroll the sequence")
    seq = x_shape[1 if layout else 0]
    lens = optional_input(inputs, 4, params)
    if lens is not None and not is_const(lens):
        raise _error(
            cell, name, "sequence_lens is not a constant; only a constant equal to the full "
            "sequence length for every batch entry is supported",
        )
    if lens is not None and np.any(lens.value.numpy() != seq):
        raise _error(
            cell, name, f"sequence_lens {lens.value.numpy().tolist()} differs from the sequence "
            f"length {seq}; only full-length sequences are supported",
        )
    clip = attr.get("clip")
    return _Node(
        hidden=int(attr.get("hidden_size", r_shape[-1])),
        directions=dirs,
        layout=layout,
        clip=None if clip is None else float(clip),
        acts=acts,
        linear_before_reset=bool(int(attr.get("linear_before_reset", 0))),
    )


class _Emitter:
    """Emits one node's ops through the frontend's BlockBuilder.

    Slices, transposes and sums of constant weights are done in numpy, so the module holds the
    weights in the layout the kernels read and no constant-folding pass is needed.
    """

    def __init__(self, bb: relax.BlockBuilder, node: _Node):
        self.bb, self.node = bb, node

    def __call__(self, expr: relax.Expr) -> relax.Expr:
        return self.bb.emit(expr)

    def direction(self, t: relax.Expr, d: int, keep_dim: bool = False) -> relax.Expr:
        """t[d] (t[d:d+1] with keep_dim) of a [num_directions, ...] tensor."""
        if is_const(t):
            v = t.value.numpy()
            return array_const(v[d : d + 1] if keep_dim else v[d])
        part = self(relax.op.strided_slice(t, axes=[0], begin=[d], end=[d + 1]))
        return part if keep_dim else self(relax.op.squeeze(part, axis=[0]))

    def rows(self, t: relax.Expr, begin: int, end: int) -> relax.Expr:
        """t[begin:end] along the first axis (gate blocks of a weight, bias or peephole)."""
        if is_const(t):
            return array_const(t.value.numpy()[begin:end])
        return self(relax.op.strided_slice(t, axes=[0], begin=[begin], end=[end]))

    def time_major(self, t: relax.Expr) -> relax.Expr:
        """A layout=1 tensor ([batch, seq or num_directions, n]) with its first axes swapped."""
        if is_const(t):
            return array_const(np.ascontiguousarray(np.swapaxes(t.value.numpy(), 0, 1)))
        return self(relax.op.permute_dims(t, [1, 0, 2]))

    def transposed(self, t: relax.Expr) -> relax.Expr:
        if is_const(t):
            return array_const(np.ascontiguousarray(t.value.numpy().T))
        return self(relax.op.permute_dims(t))

    def add(self, a: relax.Expr | None, b: relax.Expr | None) -> relax.Expr | None:
        """a + b, either of which may be absent (zero)."""
        if a is None or b is None:
            return a if b is None else b
        if is_const(a) and is_const(b):
            return array_const(a.value.numpy() + b.value.numpy())
        return self(relax.op.add(a, b))

    def concat(self, parts: list[relax.Expr]) -> relax.Expr:
        if all(is_const(t) for t in parts):
            return array_const(np.concatenate([t.value.numpy() for t in parts]))
        return self(relax.op.concat(parts, axis=0))

    def mul(self, a: relax.Expr, b: relax.Expr) -> relax.Expr:
        return self(relax.op.multiply(a, b))

    def act(self, f: Activation, x: relax.Expr) -> relax.Expr:
        """f(x), with the node's clip (if any) applied to the activation's input, as ONNX says."""
        if self.node.clip is not None:
            x = self(relax.op.clip(x, -self.node.clip, self.node.clip))
        return self(f(x))

    def split(self, x: relax.Expr, parts: int, axis: int) -> list[relax.Expr]:
        """`parts` equal pieces of `x` along `axis` (one op: gate blocks, time steps)."""
        if parts == 1:
            return [x]
        pieces = self(relax.op.split(x, parts, axis=axis))
        return [self(relax.TupleGetItem(pieces, i)) for i in range(parts)]


def _state(e: _Emitter, t: relax.Expr | None, d: int) -> relax.Expr | None:
    """Direction d's initial state as [1, batch, hidden]; None when absent or all zeros (as
    exporters write them: the first step then skips the terms it would zero)."""
    if t is None or (is_const(t) and not np.any(t.value.numpy())):
        return None
    return e.direction(e.time_major(t) if e.node.layout else t, d, keep_dim=True)


def _lstm_step(
    e: _Emitter,
    acts: tuple[Activation, ...],
    x_t: relax.Expr,
    h: relax.Expr | None,
    c: relax.Expr | None,
    rt: list[relax.Expr],
    p: list[relax.Expr] | None,
) -> tuple[relax.Expr, relax.Expr]:
    f, g, hf = acts
    pre = x_t if h is None else e.add(x_t, e(relax.op.matmul(h, rt[0])))
    i, o, fg, cc = e.split(pre, 4, axis=-1)
    if p is not None and c is not None:  # peepholes P[i, o, f]; Ct-1 feeds i and f
        i, fg = e.add(i, e.mul(p[0], c)), e.add(fg, e.mul(p[2], c))
    ic = e.mul(e.act(f, i), e.act(g, cc))
    c = ic if c is None else e.add(e.mul(e.act(f, fg), c), ic)
    if p is not None:  # Ct feeds o
        o = e.add(o, e.mul(p[1], c))
    return e.mul(e.act(f, o), e.act(hf, c)), c


def _gru_step(
    e: _Emitter,
    acts: tuple[Activation, ...],
    x_t: relax.Expr,
    h: relax.Expr | None,
    rt: list[relax.Expr],
    rbh: relax.Expr | None,
) -> relax.Expr:
    f, g = acts
    xz, xr, xh = e.split(x_t, 3, axis=-1)
    if h is None:  # Ht-1 = 0: no recurrent matmul, only Rbh (linear_before_reset) survives
        z, r = e.act(f, xz), e.act(f, xr)
        n = e.act(g, xh if rbh is None else e.add(xh, e.mul(r, rbh)))
        return e.mul(e(relax.op.subtract(relax.const(1, n.ty.dtype), z)), n)
    if e.node.linear_before_reset:  # ht = g(Xt*Wh^T + rt (.) (Ht-1*Rh^T + Rbh) + Wbh)
        hz, hr, hh = e.split(e(relax.op.matmul(h, rt[0])), 3, axis=-1)
        z, r = e.act(f, e.add(xz, hz)), e.act(f, e.add(xr, hr))
        n = e.act(g, e.add(xh, e.mul(r, e.add(hh, rbh))))
    else:  # ht = g(Xt*Wh^T + (rt (.) Ht-1)*Rh^T + Rbh + Wbh)
        hz, hr = e.split(e(relax.op.matmul(h, rt[0])), 2, axis=-1)
        z, r = e.act(f, e.add(xz, hz)), e.act(f, e.add(xr, hr))
        n = e.act(g, e.add(xh, e(relax.op.matmul(e.mul(r, h), rt[1]))))
    # Ht = (1 - zt) (.) ht + zt (.) Ht-1, written ht + zt (.) (Ht-1 - ht): one op fewer
    return e.add(n, e.mul(z, e(relax.op.subtract(h, n))))


def _rnn_step(
    e: _Emitter, acts: tuple[Activation, ...], x_t: relax.Expr, h: relax.Expr | None,
    rt: list[relax.Expr],
) -> relax.Expr:
    return e.act(acts[0], x_t if h is None else e.add(x_t, e(relax.op.matmul(h, rt[0]))))


def _convert(
    cell: _Cell, bb: relax.BlockBuilder, inputs: list, attr: dict, params: list
) -> relax.Tuple:
    """Y, Y_h (and Y_c for LSTM) of one recurrent node, unrolled over its static sequence."""
    node = _parse(cell, inputs, attr, params)
    e = _Emitter(bb, node)
    x, w, r, b, h0 = inputs[0], *(optional_input(inputs, i, params) for i in (1, 2, 3, 5))
    c0, peep = (optional_input(inputs, i, params) if cell is _LSTM else None for i in (6, 7))
    if node.layout:  # batch-major tensors become time-major inside (initial states: in _state)
        x = e.time_major(x)
    seq, hsz, gates = static_shape(x)[0], node.hidden, cell.gates
    ys, hs, cs = [], [], []
    for d, direction in enumerate(node.directions):
        rd = e.direction(r, d)  # [gates*hidden, hidden]
        if cell is _GRU and not node.linear_before_reset:  # Rh multiplies rt (.) Ht-1 apart
            rt = [e.transposed(e.rows(rd, 0, 2 * hsz)), e.transposed(e.rows(rd, 2 * hsz, 3 * hsz))]
        else:
            rt = [e.transposed(rd)]
        bias = rbh = None
        if b is not None:  # Wb and Rb join the input projection, except GRU's Rbh before reset
            bd = e.direction(b, d)
            wb, rb = e.rows(bd, 0, gates * hsz), e.rows(bd, gates * hsz, 2 * gates * hsz)
            if cell is _GRU and node.linear_before_reset:
                rbh = e.rows(rb, 2 * hsz, 3 * hsz)
                zeros = array_const(np.zeros(hsz, str(x.ty.dtype)))
                rb = e.concat([e.rows(rb, 0, 2 * hsz), zeros])
            bias = e.add(wb, rb)
        # Xt*W^T + biases for all steps in one matmul: [seq, batch, gates*hidden]
        xw = e.add(e(relax.op.matmul(x, e.transposed(e.direction(w, d)))), bias)
        steps = e.split(xw, seq, axis=0)  # [1, batch, gates*hidden] each
        h, c = _state(e, h0, d), _state(e, c0, d)
        p = None
        if peep is not None:
            pd = e.direction(peep, d)
            p = [e.rows(pd, k * hsz, (k + 1) * hsz) for k in range(3)]
        out: dict[int, relax.Expr] = {}
        for t in range(seq) if direction == "forward" else range(seq - 1, -1, -1):
            if cell is _LSTM:
                h, c = _lstm_step(e, node.acts[d], steps[t], h, c, rt, p)
            elif cell is _GRU:
                h = _gru_step(e, node.acts[d], steps[t], h, rt, rbh)
            else:
                h = _rnn_step(e, node.acts[d], steps[t], h, rt)
            out[t] = h
        ys.append(e(relax.op.concat([out[t] for t in range(seq)], axis=0)) if seq > 1 else out[0])
        hs.append(h)
        cs.append(c)
    outs = [e(relax.op.stack(ys, axis=1))]  # Y: [seq, num_directions, batch, hidden]
    # Y_h, Y_c: [num_directions, batch, hidden]
    for states in (hs, cs) if cell is _LSTM else (hs,):
        outs.append(states[0] if len(states) == 1 else e(relax.op.concat(states, axis=0)))
    if node.layout:
        outs = [e(relax.op.permute_dims(outs[0], [2, 0, 1, 3]))] + [
            e(relax.op.permute_dims(s, [1, 0, 2])) for s in outs[1:]
        ]
    return relax.Tuple(outs)


CONVERTERS: dict[str, type] = {
    cell.op: converter(cell.op, {1: functools.partial(_convert, cell)}) for cell in (_LSTM, _GRU, _RNN)
}

# an LSTM node's Y, Y_h, Y_c from its (float) inputs, for converters of its variants
lstm = functools.partial(_convert, _LSTM)
