"""ONNX recurrent operators (LSTM, GRU, RNN) as unrolled Relax ops.

TVM's Relax ONNX frontend has no converter for them, so models with a recurrent layer would not
import. Shapes are static in autofuse (the importer fixes input shapes), so the sequence length
is known and the recurrence is unrolled: each time step's matmul and gate elementwise ops become
ordinary kernels that LegalizeOps and the fusion search see like any others. As in ONNX
Runtime, the input projection X*W^T (plus the biases) is one matmul over all steps; only H*R^T
stays per step. The directions of a bidirectional node step together, their states stacked
([1, directions, batch, hidden]) and their recurrent matmuls batched: one set of kernels a
step, not one per direction, since at these sizes a step's time is mostly the kernels' calls.
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

    def direction(self, t: relax.Expr, d: int) -> relax.Expr:
        """t[d] of a [num_directions, ...] tensor."""
        if is_const(t):
            return array_const(t.value.numpy()[d])
        return self(relax.op.squeeze(self.directions(t, range(d, d + 1)), axis=[0]))

    def directions(self, t: relax.Expr, dirs: range) -> relax.Expr:
        """t[dirs] of a [num_directions, ...] tensor, the axis kept."""
        if dirs == range(static_shape(t)[0]):
            return t
        if is_const(t):
            return array_const(t.value.numpy()[dirs.start : dirs.stop])
        return self(relax.op.strided_slice(t, axes=[0], begin=[dirs.start], end=[dirs.stop]))

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

    def concat(self, parts: list[relax.Expr], axis: int = 0) -> relax.Expr:
        if len(parts) == 1:
            return parts[0]
        if all(is_const(t) for t in parts):
            return array_const(np.concatenate([t.value.numpy() for t in parts], axis=axis))
        return self(relax.op.concat(parts, axis=axis))

    def stack(self, parts: list[relax.Expr], rows: bool = False) -> relax.Expr:
        """The directions' tensors as the stepping directions read them: one direction's as it
        is, several stacked along a new first axis (`rows`: with an axis of 1 after it, to
        broadcast over the batch)."""
        if len(parts) == 1:
            return parts[0]
        if all(is_const(t) for t in parts):
            v = np.stack([t.value.numpy() for t in parts])
            return array_const(v[:, None] if rows else v)
        both = self(relax.op.stack(parts, axis=0))
        return self(relax.op.expand_dims(both, 1)) if rows else both

    def mul(self, a: relax.Expr, b: relax.Expr) -> relax.Expr:
        return self(relax.op.multiply(a, b))

    def act(self, f: Activation, x: relax.Expr) -> relax.Expr:
        """f(x), with the node's clip (if any) applied to the activation's input, as ONNX says."""
        if self.node.clip is not None:
            x = self(relax.op.clip(x, -self.node.clip, self.node.clip))
        return self(f(x))

    def split(self, x: relax.Expr, parts: int, axis: int) -> list[relax.Expr]:
        """`parts` equal pieces of `x` along `axis`, in one op (the time steps)."""
        if parts == 1:
            return [x]
        pieces = self(relax.op.split(x, parts, axis=axis))
        return [self(relax.TupleGetItem(pieces, i)) for i in range(parts)]

    def blocks(self, x: relax.Expr, parts: int) -> list[relax.Expr]:
        """`parts` equal blocks of `x`'s last axis (gates, directions), each a slice of its own: a
        slice with one consumer fuses into the gate's elementwise kernel, where a split is a
        kernel of its own (and a tuple) at every step."""
        n = static_shape(x)[-1] // parts
        return [self(relax.op.strided_slice(x, axes=[-1], begin=[k * n], end=[(k + 1) * n]))
                for k in range(parts)]


def _state(e: _Emitter, t: relax.Expr | None, dirs: range) -> relax.Expr | None:
    """The initial state of directions `dirs` as [len(dirs), batch, hidden]; None when absent or
    all zeros (as exporters write them: the first step then skips the terms it would zero)."""
    if t is None or (is_const(t) and not np.any(t.value.numpy())):
        return None
    return e.directions(e.time_major(t) if e.node.layout else t, dirs)


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
    i, o, fg, cc = e.blocks(pre, 4)
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
    xz, xr, xh = e.blocks(x_t, 3)
    if h is None:  # Ht-1 = 0: no recurrent matmul, only Rbh (linear_before_reset) survives
        z, r = e.act(f, xz), e.act(f, xr)
        n = e.act(g, xh if rbh is None else e.add(xh, e.mul(r, rbh)))
        return e.mul(e(relax.op.subtract(relax.const(1, n.ty.dtype), z)), n)
    if e.node.linear_before_reset:  # ht = g(Xt*Wh^T + rt (.) (Ht-1*Rh^T + Rbh) + Wbh)
        hz, hr, hh = e.blocks(e(relax.op.matmul(h, rt[0])), 3)
        z, r = e.act(f, e.add(xz, hz)), e.act(f, e.add(xr, hr))
        n = e.act(g, e.add(xh, e.mul(r, e.add(hh, rbh))))
    else:  # ht = g(Xt*Wh^T + (rt (.) Ht-1)*Rh^T + Rbh + Wbh)
        hz, hr = e.blocks(e(relax.op.matmul(h, rt[0])), 2)
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
    n = len(node.directions)
    # directions step together where their activations agree (ONNX lets each have its own)
    batches = [range(n)] if len(set(node.acts)) == 1 else [range(d, d + 1) for d in range(n)]
    ys, hs, cs = [], [], []
    for dirs in batches:
        y, h, c = _unroll(cell, e, dirs, x, w, r, b, h0, c0, peep)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    outs = [e.concat(ys, axis=1)]  # Y: [seq, num_directions, batch, hidden]
    # Y_h, Y_c: [num_directions, batch, hidden]
    for states in (hs, cs) if cell is _LSTM else (hs,):
        outs.append(e.concat(states))
    if node.layout:
        outs = [e(relax.op.permute_dims(outs[0], [2, 0, 1, 3]))] + [
            e(relax.op.permute_dims(s, [1, 0, 2])) for s in outs[1:]
        ]
    return relax.Tuple(outs)


def _unroll(
    cell: _Cell,
    e: _Emitter,
    dirs: range,
    x: relax.Expr,
    w: relax.Expr,
    r: relax.Expr,
    b: relax.Expr | None,
    h0: relax.Expr | None,
    c0: relax.Expr | None,
    peep: relax.Expr | None,
) -> tuple[relax.Expr, relax.Expr, relax.Expr | None]:
    """Directions `dirs` stepped together over the sequence (several: their states [1, dirs,
    batch, hidden]): their outputs in time order ([seq, len(dirs), batch, hidden]), and their
    last hidden (and cell) state ([len(dirs), batch, hidden])."""
    node, hsz, gates = e.node, e.node.hidden, cell.gates
    rts, biases, rbhs, peeps = [], [], [], []
    for d in dirs:
        rd = e.direction(r, d)  # [gates*hidden, hidden]
        if cell is _GRU and not node.linear_before_reset:  # Rh multiplies rt (.) Ht-1 apart
            rts.append([e.transposed(e.rows(rd, 0, 2 * hsz)), e.transposed(e.rows(rd, 2 * hsz, 3 * hsz))])
        else:
            rts.append([e.transposed(rd)])
        if b is not None:  # Wb and Rb join the input projection, except GRU's Rbh before reset
            bd = e.direction(b, d)
            wb, rb = e.rows(bd, 0, gates * hsz), e.rows(bd, gates * hsz, 2 * gates * hsz)
            if cell is _GRU and node.linear_before_reset:
                rbhs.append(e.rows(rb, 2 * hsz, 3 * hsz))
                zeros = array_const(np.zeros(hsz, str(x.ty.dtype)))
                rb = e.concat([e.rows(rb, 0, 2 * hsz), zeros])
            biases.append(e.add(wb, rb))
        if peep is not None:
            pd = e.direction(peep, d)
            peeps.append([e.rows(pd, k * hsz, (k + 1) * hsz) for k in range(3)])
    rt = [e.stack([own[k] for own in rts]) for k in range(len(rts[0]))]
    rbh = e.stack(rbhs, rows=True) if rbhs else None
    p = [e.stack([own[k] for own in peeps], rows=True) for k in range(3)] if peeps else None
    # Xt*W^T + biases for all steps and directions in one matmul: [seq, batch, dirs*gates*hidden]
    wt = e.concat([e.transposed(e.direction(w, d)) for d in dirs], axis=1)
    xw = e.add(e(relax.op.matmul(x, wt)), e.concat(biases) if biases else None)
    seq = static_shape(x)[0]
    reverse = [node.directions[d] == "reverse" for d in dirs]
    h, c = _state(e, h0, dirs), _state(e, c0, dirs)
    if len(dirs) == 1:
        steps = e.split(xw, seq, axis=0)[:: -1 if reverse[0] else 1]  # [1, batch, gates*hidden] each
    else:  # each direction's inputs in its own time order: [1, dirs, batch, gates*hidden] a step
        parts = [e(relax.op.flip(t, axis=0)) if rev else t for t, rev in zip(e.blocks(xw, len(dirs)), reverse)]
        steps = e.split(e(relax.op.stack(parts, axis=1)), seq, axis=0)
        h, c = (None if t is None else e(relax.op.expand_dims(t, 0)) for t in (h, c))
    acts = node.acts[dirs[0]]
    hk: list[relax.Expr] = []
    for x_t in steps:
        if cell is _LSTM:
            h, c = _lstm_step(e, acts, x_t, h, c, rt, p)
        elif cell is _GRU:
            h = _gru_step(e, acts, x_t, h, rt, rbh)
        else:
            h = _rnn_step(e, acts, x_t, h, rt)
        hk.append(h)
    if len(dirs) == 1:
        return e(relax.op.expand_dims(e.concat(hk[::-1] if reverse[0] else hk), 1)), h, c
    # Y[t]: each direction's output at time t, from step t or (reversed) seq-1-t, picked lane by
    # lane; the picks then concatenate along time as they are, a loop per step
    # (schedule._schedule_concat, _one_step). A flip after the concatenation was inlined into
    # its readers, which then tested every step's bounds at each element (Sequencer2D's last
    # step and output: 0.5-0.9 ms a call)
    forward = array_const(np.array([not rev for rev in reverse]).reshape(1, -1, 1, 1))
    ys = [e(relax.op.where(forward, hk[t], hk[seq - 1 - t])) for t in range(seq)]
    return e.concat(ys), e(relax.op.squeeze(h, [0])), None if c is None else e(relax.op.squeeze(c, [0]))


CONVERTERS: dict[str, type] = {
    cell.op: converter(cell.op, {1: functools.partial(_convert, cell)}) for cell in (_LSTM, _GRU, _RNN)
}

# an LSTM node's Y, Y_h, Y_c from its (float) inputs, for converters of its variants
lstm = functools.partial(_convert, _LSTM)
