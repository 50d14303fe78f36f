"""TVM read side: normalise a Relax module and read its operator graph and FuseOps' grouping.

With apply.py (write side) and build.py (compile and run), this is the thin layer that touches
TVM internals; everything else in autofuse works on OpGraph and FusionPlan. Ordering rules:
`normalize` runs the passes TVM's default pipeline runs before FuseOps; `extract_graph` and
`apply.apply_plan` expect its output.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import math
import warnings
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax
from tvm import tirx

from autofuse.graph import OpGraph
from autofuse.graph import OpKind
from autofuse.graph import OpNode
from autofuse.onnx_converters import calls_op
from autofuse.onnx_sizes import scalar_tensor
from autofuse.plan import FusionPlan
from autofuse.schedule import SERIAL_INNER
from autofuse.schedule import whole_tile_rows


@lru_cache(maxsize=1)
def skip_schedule_type_checks() -> int:
    """Call TIR Schedule's methods without their Python argument checks; returns how many.

    Every method of `tvm.s_tir.Schedule` is wrapped by `_type_checker.type_checked`, which binds
    and checks each argument against its annotations on every call: in a large model's
    rule-based schedules a quarter of the time (RWKV, a plan of 89 kernels: 4.0 s to schedule,
    2.9 s unchecked). The measurement worker, a process of autofuse's own that
    runs only autofuse's schedules, calls this once; the FFI still checks what reaches C++.
    A user's process (the pass, `autofuse apply`) keeps the checks."""
    from tvm import s_tir

    n = 0
    for name, attr in list(vars(s_tir.Schedule).items()):
        plain = getattr(attr, "__wrapped__", None)
        if callable(attr) and callable(plain):
            setattr(s_tir.Schedule, name, plain)
            n += 1
    return n


@lru_cache(maxsize=1)
def call_tir_op() -> tvm.ir.Op:
    return tvm.ir.Op.get("relax.call_tir")


@lru_cache(maxsize=1)
def call_tir_inplace_op() -> tvm.ir.Op:
    return tvm.ir.Op.get("relax.call_tir_inplace")


def normalize(mod: tvm.IRModule, notes: list[str] | None = None) -> tvm.IRModule:
    """Legalize `mod` the way TVM's default pipeline does before FuseOps, plus inference folds.

    Conv+BatchNorm with constant parameters is folded into the conv weights and a bias
    (W*g/s, (b-m)*g/s+beta); remaining batch norms are decomposed to elementwise ops.
    Convolutions are converted to channels-last (NHWC/NWC/NDHWC data, HWIO/WIO/DHWIO weights; an
    audio model's feature extractor as an image model's stem; a video model's 3-D convolutions
    ran at 5 GFLOP/s channels-first, 200 channels-last: R3D-18 in `vm_profile.py`) and the layout is
    propagated through the elementwise ops and pools around them: the output channel is then the
    contiguous innermost axis of outputs and weights, which is what a vectorised kernel needs
    (NCHW pools and depthwise convolutions can only vectorise along strided image rows).
    Weight transposes fold into the constants; the graph's inputs and outputs keep their layout.
    Taps of a convolution that read only padding are left out (LiveTaps), and one whose taps
    read mostly padding runs as the sum of its taps, each over the outputs where it reads the
    input (TapsApart).
    Gathers and scatters at constant indices (an unrolled scan's `x[:, t]`) become the slices
    and selects they compute (ConstantIndexing), which fuse; TVM marks them opaque.

    Transcendentals are vectorisable: activations are spelled out in exp/erf/tanh (VectorMath),
    which become TVM's fast polynomial versions (FastMathTransform; outputs of the benchmark
    transformers stay within 3e-6 of onnxruntime). As libm calls they run one element at a
    time: GPT-2's GELU took 173 of a 620 us model that way, 6 us after.

    A step that could not be applied (the layout change, where TVM's pass fails) is appended to
    `notes` (the import's notes, which `autofuse tune` prints and records), or warned where no
    list is given (a module handed to deploy.AutofuseFusion).
    """
    if "main" in [gv.name_hint for gv in mod.get_global_vars()] and not any(
            isinstance(b, relax.DataflowBlock) for b in getattr(mod["main"].body, "blocks", [])):
        # TVM's frontend leaves a graph with an If (a detector's "no box left" branch) without
        # dataflow blocks: the ops around it are put back into them, where plans fuse them
        mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
    mod = tvm.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            # batch norms left unfolded become elementwise ops before the layout changes
            # (ConvertLayout crashes on batch_norm's tuple output in TVM 0.27)
            relax.transform.DecomposeOpsForInference(),
        ]
    )(mod)
    indexing = ("relax.take", "relax.scatter_elements", "relax.scatter_nd")
    if _indexed_by_constants(mod, indexing):
        # constant indices are often computed in the graph (ONNX's negative indices wrapped by
        # `where`): folded first (only then: folding BERT-base's weights takes 3 s). The module
        # changes only where an op was rewritten: every other model keeps its workload key, and
        # the plans logged under it
        folded = relax.transform.FoldConstant()(mod)
        rewritten = ConstantIndexing()(folded)
        mod = rewritten if count_calls(rewritten, *indexing) < count_calls(folded, *indexing) else mod
    mod = TapsApart()(LiveTaps()(LayoutFriendlyOps()(mod)))
    if count_calls(mod, *_CONVOLUTIONS):
        mod = relax.transform.FoldConstant()(mod)  # folded BN weights: ConvertLayout needs constants
        # transposed convolutions stay NCHW: TVM 0.27 lowers them in no other layout
        failed = ""
        try:
            mod, failed = _block_by_block(mod, relax.transform.ConvertLayout(
                {"relax.nn.conv2d": ["NHWC", "HWIO"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"],
                 "relax.nn.conv1d": ["NWC", "WIO"], "relax.nn.conv3d": ["NDHWC", "DHWIO"]}
            ))
        except Exception as err:  # noqa: BLE001 - any failure of TVM's pass: keep the layout
            # channels-first is slower, not wrong. The failures met so far (std::bad_alloc on a
            # negative squeeze axis in a 1-D conv net from torch 2.14's dynamo exporter, stack in
            # an unrolled LSTM) LayoutFriendlyOps now rewrites away; without this guard such a
            # model did not import at all
            from autofuse.importer import error_line

            failed = f"channels-last layout not applied ({error_line(err)[:120]}): convolutions stay channels-first"
        if failed and notes is None:
            warnings.warn(failed, stacklevel=2)
        elif failed:
            notes.append(failed)
    # after the layout change: FastMathTransform emits its polynomials as TIR calls, which
    # ConvertLayout cannot see through (a transpose each side of every SiLU between convolutions)
    mod = tvm.transform.Sequential(
        [VectorMath(), WholeVectorChannels(), WholeTileRows(), FastMath()]
    )(mod)
    # sort/scan ops (cumsum in RoBERTa's position ids, sort, top-k) have no legalization: TVM's
    # pipeline dispatches them to kernels first. The generic (CPU) kernels serve every target:
    # the workload is normalised once, and on CUDA DLight's fallback schedules them.
    with tvm.target.Target("llvm"):
        mod = tvm.transform.Sequential([relax.backend.DispatchSampling(), relax.backend.DispatchSortScan()])(mod)
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(_LEGALIZATIONS),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.DeadCodeElimination(),
        ]
    )
    mod = seq(mod)
    if any(isinstance(b.value, relax.Tuple) for b in main_block(mod).bindings):
        # a batch norm decomposed for inference leaves `t = (y, mean, var); x = t[0]` (DenseNet's
        # BN after a concat): bindings outside any kernel that can sit between two parts of one
        # fused group, a cycle when the group is emitted. Forwarded, then dropped. Only then: the
        # pass also renames the output binding, which would change every model's key (and so
        # orphan the plans already in tuning logs).
        mod = tvm.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                        relax.transform.DeadCodeElimination()])(mod)
    return mod


# the sign-cleared bit pattern of +infinity, per float width
_INF_BITS = {16: 0x7C00, 32: 0x7F800000, 64: 0x7FF0000000000000}


def _legalize_float_class(op_name: str):
    """isnan/isinf as integer tests on the bits (|x| bits above / equal to those of infinity).

    TVM legalises them as calls that run one element at a time inside a vectorised loop: the
    `where(isnan(p), 0, p)` torch's exported attention puts after every softmax took 3.6 of
    its kernel's 6.8 us in BERT. Float comparisons cannot stand in: TVM's simplifier folds
    `x != x` to false. bfloat16 and other types keep TVM's legalization."""
    stock = tvm.ir.Op.get(op_name).get_attr("FLegalize")
    short = op_name.split(".")[-1]  # isnan | isinf

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        dtype = str(getattr(call.args[0].ty, "dtype", ""))
        bits = tvm.DataType(dtype).bits if dtype.startswith("float") else 0
        if bits not in _INF_BITS:
            return stock(bb, call)
        from tvm import te
        from tvm import tirx

        ity = f"int{bits}"
        inf, mask = tirx.const(_INF_BITS[bits], ity), tirx.const((1 << (bits - 1)) - 1, ity)

        def test(x: te.Tensor) -> te.Tensor:
            def element(*i: tirx.Var) -> tirx.PrimExpr:
                magnitude = tirx.reinterpret(ity, x(*i)) & mask
                return magnitude > inf if short == "isnan" else magnitude == inf
            return te.compute(x.shape, element, name=short)

        return bb.call_te(test, call.args[0], primfunc_name_hint=f"tir_{short}")

    return legalize


_FLOAT_CLASS_TESTS = {name: _legalize_float_class(name) for name in ("relax.isnan", "relax.isinf")}


def _group_norm_two_pass(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A group norm whose variance is the mean of squared deviations from the mean, computed
    after it (LayerNorm's scheme in TVM). TVM's own (topi.nn.group_norm) takes E[x^2] - E[x]^2 in
    one pass, in float32: a group whose mean is far from zero against its spread loses its
    variance to cancellation (groups at 300 +- 1 off by up to 0.035). Half-precision inputs are
    summed in float32."""
    from tvm import te

    x, gamma, beta = call.args
    a = call.attrs
    rank = x.ty.ndim
    groups, eps = int(a.num_groups), float(a.epsilon)
    c_axis, axes = int(a.channel_axis) % rank, [int(i) % rank for i in a.axes]

    def compute(x: te.Tensor, gamma: te.Tensor, beta: te.Tensor) -> te.Tensor:
        per = x.shape[c_axis] // groups
        kept = [i for i in range(rank) if i != c_axis and i not in axes]
        count = per
        for i in axes:
            count = count * x.shape[i]

        def element(stat: list, red: list) -> list:  # x's index from (kept axes, group) and (axes, channel in group)
            index, it = [None] * rank, iter(red[:-1])
            for k, i in enumerate(kept):
                index[i] = stat[k]
            for i in axes:
                index[i] = next(it)
            index[c_axis] = stat[-1] * per + red[-1]
            return index

        def reduce_axes() -> list:
            return [te.reduce_axis((0, x.shape[i])) for i in axes] + [te.reduce_axis((0, per))]

        shape = [x.shape[i] for i in kept] + [groups]
        acc = "float32" if tvm.DataType(x.dtype).bits < 32 else x.dtype  # half precision: sums in float32
        n = tirx.Cast(acc, count)

        def at(index: list) -> tirx.PrimExpr:
            return tirx.Cast(acc, x[tuple(index)])

        def sum_of(*stat):
            red = reduce_axes()
            return te.sum(at(element(list(stat), red)), axis=red)

        total = te.compute(shape, sum_of, name="group_sum")

        def squares_of(*stat):
            red = reduce_axes()
            d = at(element(list(stat), red)) - total[stat] / n
            return te.sum(d * d, axis=red)

        squares = te.compute(shape, squares_of, name="group_squares")

        def out(*i):
            stat = tuple([i[k] for k in kept] + [i[c_axis] // per])
            c = i[c_axis]
            scale = te.rsqrt(squares[stat] / n + tirx.const(eps, acc)) * tirx.Cast(acc, gamma[c])
            return tirx.Cast(x.dtype, (at(list(i)) - total[stat] / n) * scale + tirx.Cast(acc, beta[c]))

        return te.compute(x.shape, out, name="T_group_norm")

    return bb.call_te(compute, x, gamma, beta, primfunc_name_hint="group_norm")


_LEGALIZATIONS = {**_FLOAT_CLASS_TESTS, "relax.nn.group_norm": _group_norm_two_pass}


@relax.expr_functor.mutator
class _VectorMathRewriter(relax.PyExprMutator):
    """Float activations rewritten into ops that vectorise (see VectorMath)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
            return call
        x = call.args[0] if call.args else None
        if x is None or "float" not in str(getattr(x.ty, "dtype", "")):
            return call
        dtype = str(x.ty.dtype)
        name = call.op.name
        if name == "relax.power":
            product = self._power(x, call.args[1])
            return call if product is None else product
        if name == "relax.nn.gelu":  # x * (1/2 + erf(x / sqrt 2) / 2), as TVM legalises it
            erf = self._emit(relax.op.erf(self._emit(relax.op.multiply(x, _c(0.7071067811865476, dtype)))))
            half = self._emit(relax.op.add(_c(0.5, dtype), self._emit(relax.op.multiply(erf, _c(0.5, dtype)))))
            return self._emit(relax.op.multiply(x, half))
        if name == "relax.nn.gelu_tanh":  # x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
            cube = self._power(x, _c(3.0, dtype))
            inner = self._emit(relax.op.add(x, self._emit(relax.op.multiply(cube, _c(0.044715, dtype)))))
            t = self._emit(relax.op.tanh(self._emit(relax.op.multiply(inner, _c(0.7978845608028654, dtype)))))
            half_x = self._emit(relax.op.multiply(x, _c(0.5, dtype)))
            return self._emit(relax.op.multiply(half_x, self._emit(relax.op.add(t, _c(1.0, dtype)))))
        if name == "relax.sigmoid":
            return self._sigmoid(x, dtype)
        if name == "relax.nn.silu":
            return self._emit(relax.op.multiply(x, self._sigmoid(x, dtype)))
        divisor = _constant_array(call.args[1]) if name == "relax.divide" else None
        if divisor is not None and str(divisor.dtype) == dtype:
            # by a constant: a multiply by its reciprocal (HardSwish's / 6 in MobileNetV3's
            # epilogues, a batch norm's / sqrt(var + eps) where it could not fold into a
            # convolution, as in DenseNet); a vector division costs ~10 multiplies, the result
            # moves by one ulp. (Scalars too: DynamicQuantizeLinear's scale, (max - min) / 255,
            # divided exactly came within onnxruntime's bits, but then differed between fusion
            # plans, which LLVM compiles the division into differently: the int8 CRNN's plans
            # 1e-6 apart as products, 0.0085 as divisions, where a quantized activation rounds
            # to the next integer.)
            if np.all(np.isfinite(divisor)) and np.all(divisor != 0):
                return self._emit(relax.op.multiply(x, relax.const((1 / divisor).astype(dtype))))
        return call

    def _emit(self, expr: relax.Expr) -> relax.Expr:
        return self.builder_.normalize(expr)

    def _sigmoid(self, x: relax.Expr, dtype: str) -> relax.Expr:  # 1 / (1 + exp(-x))
        e = self._emit(relax.op.exp(self._emit(relax.op.negative(x))))
        return self._emit(relax.op.divide(_c(1.0, dtype), self._emit(relax.op.add(e, _c(1.0, dtype)))))

    def _power(self, base: relax.Expr, exponent: relax.Expr) -> relax.Expr | None:
        value = _constant_array(exponent)
        power = float(value.reshape(())) if value is not None and value.size == 1 else None
        if power not in (2.0, 3.0):
            return None
        out = self._emit(relax.op.multiply(base, base))
        return self._emit(relax.op.multiply(out, base)) if power == 3.0 else out


def _constant_array(expr: relax.Expr) -> np.ndarray | None:
    """The value of a constant operand: a tensor constant's array, a scalar PrimValue's (a
    binary op takes either; Mask R-CNN's mask paste divides by a float PrimValue), else None."""
    if isinstance(expr, tvm.ir.expr.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, (tirx.FloatImm, tirx.IntImm)):
        return np.array(expr.value, str(expr.ty))
    return None


def _c(value: float, dtype: str) -> relax.Expr:
    return relax.const(value, dtype)


@tvm.transform.module_pass(opt_level=0, name="AutofuseVectorMath")
class VectorMath:
    """Activations as arithmetic TVM can vectorise: x**2 and x**3 (constant exponents) as
    products, division by a constant as a product; GELU (erf and tanh forms), sigmoid and SiLU
    spelled out in exp/erf/tanh, which FastMathTransform then replaces with polynomials.
    Legalised as they are, they become libm calls (erf, tanh, exp, pow) that run one element at
    a time."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _rewrite_functions(mod, _VectorMathRewriter)


@tvm.transform.module_pass(opt_level=0, name="AutofuseFastMath")
class FastMath:
    """TVM's FastMathTransform (exp, erf, tanh and softmax as polynomials) on calls of operators
    only: TVM's reads every call's `op.name`, and a call of a function (onnx_loop_function's loops)
    has none."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from tvm.relax.transform.fast_math import FastMathCodeGenerator

        @relax.expr_functor.mutator
        class _OpsOnly(FastMathCodeGenerator._cls):
            def visit_call_(self, call: relax.Call) -> relax.Expr:
                if isinstance(call.op, tvm.ir.Op):
                    return super().visit_call_(call)
                return relax.PyExprMutator.visit_call_(self, call)

        return _rewrite_functions(mod, _OpsOnly)


def _rewrite_functions(mod: tvm.IRModule, rewriter_class: type) -> tvm.IRModule:
    rewriter = rewriter_class(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()


# the convolutions normalisation takes channels-last, pads to whole vectors and trims (LiveTaps)
_CONVOLUTIONS = {"relax.nn.conv1d": relax.op.nn.conv1d, "relax.nn.conv2d": relax.op.nn.conv2d,
                 "relax.nn.conv3d": relax.op.nn.conv3d}

_BROADCAST_BINARY = {f"relax.{op}" for op in (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum")}
_ELEMENTWISE_BINARY = _BROADCAST_BINARY | {f"relax.{op}" for op in (
    "floor_mod", "mod", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor")}


def _plain_transposed(call: relax.Call) -> bool:
    """A 2-D transposed convolution in the layouts TVM's importers give it (NCHW data, IOHW
    weights), of known shapes, one group and no dilation: what the rewrites of such convolutions
    handle."""
    x, w = call.args
    a = call.attrs
    return (x.ty.ndim == 4 and w.ty.ndim == 4 and isinstance(x.ty.shape, relax.ShapeExpr)
            and isinstance(w.ty.shape, relax.ShapeExpr) and str(a.data_layout) == "NCHW"
            and str(a.kernel_layout) == "IOHW" and str(a.out_layout or "NCHW") == "NCHW" and int(a.groups) == 1
            and all(int(v) == 1 for v in a.dilation))


@relax.expr_functor.mutator
class _LayoutRewriter(relax.PyExprMutator):
    """Ops without a layout rule, as the elementwise ops they compute (see LayoutFriendlyOps)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        # each quantize's result (the cast to its integer type) and the whole float it casts
        self.quantized: list[tuple[relax.Expr, relax.Expr]] = []

    def _reshaped_back(self, value: relax.Expr) -> relax.Expr | None:
        """y, where `value` reshapes a reshape of y back to y's own shape (onnx_composites' group
        norm of an image, reshaped as the instance norm PyTorch exported it over, and back):
        with the pair in between, ConvertLayout put a transpose on either side."""
        if not (calls_op(value, "relax.reshape") and isinstance(value.args[0], relax.Var)):
            return None
        inner = self.lookup_binding(self.visit_expr(value.args[0]))  # the reshaped value as rewritten
        y = inner.args[0] if calls_op(inner, "relax.reshape") else None
        if y is None or _static_dims(y.ty) is None or _static_dims(y.ty) != _static_dims(value.ty):
            return None
        return y

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        # a quantized value cast back to float (ConvInteger's input, see onnx_integer) is the
        # whole number quantize computed before its cast: its uses read that variable. (Bound
        # to a new variable instead, `v = whole`, it got a transpose on either side from
        # ConvertLayout, which has no rule for such a binding; a pass canonicalising the
        # bindings afterwards also renames every model's output, their workload keys with it.)
        value = binding.value
        back = self._reshaped_back(value) if isinstance(binding.var, relax.DataflowVar) else None
        if isinstance(back, relax.DataflowVar):  # its uses read y itself, for the same reason as below
            self.set_var_remap(binding.var, back)
            return
        if (isinstance(binding.var, relax.DataflowVar) and calls_op(value, "relax.astype")
                and str(value.attrs.dtype) == "float32"):
            whole = self._whole_float(self.visit_expr(value.args[0]))
            if isinstance(whole, relax.DataflowVar):
                self.set_var_remap(binding.var, whole)
                return
        super().visit_var_binding_(binding)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
            return call
        name, x = call.op.name, call.args[0] if call.args else None
        dtype = str(getattr(getattr(x, "ty", None), "dtype", ""))
        emit = self.builder_.normalize
        scalar = [isinstance(getattr(a, "ty", None), tvm.ir.PrimType) for a in call.args]
        if name in _ELEMENTWISE_BINARY and any(scalar) and not all(scalar):  # scalars alone: arithmetic on them
            return self._tensor_operands(call)
        if name == "relax.clip" and dtype.startswith("float"):  # min(max(x, lo), hi)
            lo, hi = (float(getattr(a.value, "value", a.value)) for a in call.args[1:3])
            return emit(relax.op.minimum(emit(relax.op.maximum(x, _c(lo, dtype))), _c(hi, dtype)))
        if name == "relax.nn.leakyrelu" and dtype.startswith("float"):  # max(x, a x) for a <= 1
            alpha = float(call.attrs.alpha)
            scaled = emit(relax.op.multiply(x, _c(alpha, dtype)))
            return emit(relax.op.maximum(x, scaled) if alpha <= 1 else relax.op.minimum(x, scaled))
        if name in ("relax.quantize", "relax.dequantize"):
            return self._quantize(call)
        if name == "relax.nn.conv2d_transpose":
            rewritten = self._upsampling_matmul(call)
            return self._phase_convolution(call) if rewritten.same_as(call) else rewritten
        if name == "relax.einsum":
            return self._einsum_matmul(call)
        if name in ("relax.squeeze", "relax.permute_dims"):
            return self._axes_from_zero(call)
        if name == "relax.stack":  # the layout rule fails ("Index -1 out of bounds"): unrolled RNNs
            parts = x.fields if isinstance(x, relax.Tuple) else None
            ndim = call.ty.ndim
            if parts is None or ndim < 0:
                return call
            axis = int(call.attrs.axis) % ndim
            return emit(relax.op.concat([emit(relax.op.expand_dims(p, [axis])) for p in parts], axis))
        if name in _BROADCAST_BINARY and len(call.args) == 2:
            return self._full_rank_operands(call)
        if name == "relax.astype" and dtype == str(call.attrs.dtype):
            # a cast to the type it has: a copy kernel (a float16 model's casts, computed in
            # float32 on the CPU by onnx_float16, become these)
            return x
        if name == "relax.strided_slice" and not call.attrs.assume_inbound:
            return self._bounds_counted_from_start(call)
        if name == "relax.split" and not isinstance(call.ty, relax.TupleType):
            # a split into one part (torchvision's split of the boxes per image, one image) is
            # its input: the split's layout rule fails on it ("out_tuple != nullptr"), and
            # Mask R-CNN's backbone stayed channels-first
            return x
        return call

    def _bounds_counted_from_start(self, call: relax.Call) -> relax.Expr:
        """A strided slice with bounds that are expressions of sizes, each as the index from the
        start it stands for, max(b < 0 ? b + extent : b, 0) (ONNX and TVM count a negative bound
        from the end). TVM otherwise types the result with if_then_else(b < 0, ...) where it
        cannot prove b's sign (Mask R-CNN's detections, min(1000, n)), and FuseOps then fails to
        normalise that type ("Cannot find the FInferType attribute ... prim.if_then_else")."""
        x, axes, *bounds = call.args
        dims = getattr(getattr(x.ty, "shape", None), "values", None)
        if dims is None or len(bounds) < 2 or not all(isinstance(b, relax.Tuple) for b in bounds):
            return call
        if len(bounds) > 2 and not all(isinstance(s, tirx.IntImm) and int(s) > 0 for s in bounds[2].fields):
            return call  # a negative stride counts its end past the start differently
        zero = tirx.IntImm("int64", 0)

        def counted(b: object, axis: object) -> object:
            if isinstance(b, tirx.IntImm) or not isinstance(getattr(b, "ty", None), tvm.ir.PrimType):
                return b
            extent = dims[int(axis) % len(dims)]
            return tirx.max(tirx.Select(b < zero, b + extent, b), zero)

        begin, end = ([counted(b, a) for b, a in zip(t.fields, axes.fields)] for t in bounds[:2])
        if all(n.same_as(o) for n, o in zip(begin + end, list(bounds[0].fields) + list(bounds[1].fields))):
            return call
        return self.builder_.normalize(relax.Call(call.op, [x, axes, relax.Tuple(begin), relax.Tuple(end), *bounds[2:]],
                                                  call.attrs))

    def _tensor_operands(self, call: relax.Call) -> relax.Expr:
        """A binary op with a scalar PrimValue as an operand (a size read from a shape, or a
        number: onnx_sizes.scalar_tensor), the scalar a 0-d tensor of the other operand's type
        instead: TVM 0.27's ConvertLayout crashes (a segfault) on a PrimValue operand (Keypoint
        R-CNN's `argmax % width`, the width a heatmap's, resized at run time)."""
        emit = self.builder_.normalize
        dtype = str(next(a for a in call.args if isinstance(a.ty, relax.TensorType)).ty.dtype)
        tensors = [a if isinstance(a.ty, relax.TensorType) else scalar_tensor(a, dtype) for a in call.args]
        if any(t is None for t in tensors):
            return call
        return emit(relax.Call(call.op, [emit(t) for t in tensors], call.attrs))

    def _full_rank_operands(self, call: relax.Call) -> relax.Expr:
        """A binary op whose operand of lower rank is computed at run time, reshaped to the other's
        rank: TVM 0.27's layout rule keeps the op channels-first when the ranks differ, behind a
        transpose each way (an int8 model's run-time quantized bias, [C, 1, 1], added to every
        convolution's output). So is a constant of two or more dimensions (a per-channel scale
        [C, 1, 1], PyTorch's GroupNorm affine after onnx_composites' group norm), as a constant of
        the full rank; one of lower rank (a bias [C]) ConvertLayout handles."""
        a, b = call.args
        ranks = [getattr(getattr(x, "ty", None), "ndim", -1) for x in (a, b)]
        if min(ranks) < 1 or ranks[0] == ranks[1]:
            return call
        low = 0 if ranks[0] < ranks[1] else 1
        x = call.args[low]
        shape = _static_dims(x.ty)
        if shape is None or (isinstance(x, tvm.ir.expr.GenericConst) and len(shape) < 2):
            return call
        shape = [1] * abs(ranks[0] - ranks[1]) + shape
        if isinstance(x, tvm.ir.expr.GenericConst):
            full = relax.const(x.value.numpy().reshape(shape), x.ty.dtype)
        else:
            full = self.builder_.normalize(relax.op.reshape(x, shape))
        args = [full, b] if low == 0 else [a, full]
        return self.builder_.normalize(relax.Call(call.op, args, call.attrs))

    def _axes_from_zero(self, call: relax.Call) -> relax.Expr:
        """squeeze and permute_dims with their axes counted from the front. TVM 0.27's layout
        rules index the layout string with the axis as given: a negative one (PyTorch's
        `x.squeeze(-1)` after a 1-D convolution, in Silero VAD and a GroupNorm export) made
        ConvertLayout fail with std::bad_alloc and the model stayed channels-first."""
        squeeze = call.op.name == "relax.squeeze"
        axes, ndim = call.attrs.axis if squeeze else call.attrs.axes, call.args[0].ty.ndim
        if axes is None or ndim < 0 or all(int(a) >= 0 for a in axes):
            return call
        fixed = [int(a) % ndim for a in axes]
        if squeeze:
            return self.builder_.normalize(relax.op.squeeze(call.args[0], fixed))
        return self.builder_.normalize(relax.op.permute_dims(call.args[0], fixed))

    def _upsampling_matmul(self, call: relax.Call) -> relax.Expr:
        """A transposed convolution whose stride equals its kernel (a U-Net's 2x2 stride-2
        upsampling) writes each input pixel's k x k block of outputs on its own: a matmul of
        the pixels by the weights, the blocks then put in place by a transpose. TVM lowers it
        as a convolution over the input dilated with zeros (k^2 times the work, a divide and a
        modulo per element): 3.3 ms for a 32 -> 16 channel 32x32 one that onnxruntime runs in
        well under 0.3."""
        x, w = call.args
        a = call.attrs
        if not _plain_transposed(call):
            return call
        n, *rest = x.ty.shape.values  # n may be a run-time count (Keypoint R-CNN's detections)
        if not all(isinstance(d, tirx.IntImm) for d in [*rest, *w.ty.shape.values]):
            return call
        c, h, wd = (int(d) for d in rest)
        _, o, kh, kw = (int(d) for d in w.ty.shape.values)
        if [int(v) for v in a.strides] != [kh, kw] or any(int(v) for v in a.padding) \
                or any(int(v) for v in a.output_padding):
            return call
        emit = self.builder_.normalize
        pixels = emit(relax.op.reshape(emit(relax.op.permute_dims(x, [0, 2, 3, 1])), [n * h * wd, c]))
        out_dtype = None if a.out_dtype is None else str(a.out_dtype)
        blocks = emit(relax.op.matmul(pixels, emit(relax.op.reshape(w, [c, o * kh * kw])), out_dtype=out_dtype))
        blocks = emit(relax.op.reshape(blocks, [n, h, wd, o, kh, kw]))
        placed = emit(relax.op.permute_dims(blocks, [0, 3, 1, 4, 2, 5]))
        return emit(relax.op.reshape(placed, [n, o, h * kh, wd * kw]))

    def _phase_convolution(self, call: relax.Call) -> relax.Expr:
        """A strided transposed convolution as one convolution per output phase (sub-pixel), all
        phases one convolution with s_h * s_w times the output channels, interleaved after.

        Output row s*q + r of the full (unpadded) result reads the kernel rows r, s + r, 2s + r,
        ... only: a ceil(k/s)-row convolution of the input. TVM lowers a transposed convolution
        as a convolution over the input dilated with zeros: s^2 times the multiply-adds, a
        divide and a modulo per element, and no schedule (Keypoint R-CNN's 4x4 stride-2 one over
        20 detections' 512 x 14 x 14 maps: 445 ms of a 2.1 s run). A kernel that is no multiple
        of the stride gets zero rows up to one. Weights must be constants (re-laid here)."""
        x, w = call.args
        a = call.attrs
        if not _plain_transposed(call) or not isinstance(w, tvm.ir.expr.GenericConst):
            return call
        n, *rest = x.ty.shape.values
        if not all(isinstance(d, tirx.IntImm) for d in rest):
            return call
        _, h, wd = (int(d) for d in rest)
        strides = [int(v) for v in a.strides]
        top, left, bottom, right = (int(v) for v in a.padding)
        weights = w.value.numpy()
        c, o, kh, kw = weights.shape
        taps = [-(-k // st) for k, st in zip((kh, kw), strides)]  # ceil(k / s) per axis
        extra = [t * st - k for t, st, k in zip(taps, strides, (kh, kw))]  # zero kernel rows added
        if strides == [1, 1] or any(op > end + e for op, end, e in zip(a.output_padding, (bottom, right), extra)):
            return call  # output rows past the full result's: not a slice of it
        (sh, sw), (mh, mw) = strides, taps
        weights = np.pad(weights, [(0, 0), (0, 0), (0, extra[0]), (0, extra[1])])
        # [c, o, t, r_h, u, r_w] with kernel row t*s + r, taps flipped: convolution order
        phased = weights.reshape(c, o, mh, sh, mw, sw)[:, :, ::-1, :, ::-1, :]
        kernel = np.ascontiguousarray(phased.transpose(3, 5, 1, 0, 2, 4)).reshape(sh * sw * o, c, mh, mw)
        emit = self.builder_.normalize
        out_dtype = None if a.out_dtype is None else str(a.out_dtype)
        phases = emit(relax.op.nn.conv2d(x, relax.const(kernel), padding=[mh - 1, mw - 1, mh - 1, mw - 1],
                                         out_dtype=out_dtype))
        rows, cols = h + mh - 1, wd + mw - 1
        phases = emit(relax.op.reshape(phases, [n, sh, sw, o, rows, cols]))
        full = emit(relax.op.reshape(emit(relax.op.permute_dims(phases, [0, 3, 4, 1, 5, 2])),
                                     [n, o, rows * sh, cols * sw]))
        out_h, out_w = (int(d) for d in call.ty.shape.values[2:])
        return emit(relax.op.strided_slice(full, axes=[2, 3], begin=[top, left], end=[top + out_h, left + out_w]))

    def _einsum_matmul(self, call: relax.Call) -> relax.Expr:
        """A two-operand einsum that is a batched matmul (MaxViT's attention, `B G H I D, B G H
        J D -> B G H I J`) as one: permute_dims and reshape around relax.matmul. TVM legalises
        einsum as one generic loop nest that no matmul schedule recognises (MaxViT-T's 44
        einsums ran at 2-10 GFLOP/s); as matmuls, they get the GEMM tiles and fuse like
        ONNX's MatMul. Others (an outer product, a diagonal, an ellipsis) stay einsums."""
        operands = call.args[0]
        if not isinstance(operands, relax.Tuple) or len(operands.fields) != 2:
            return call
        a, b = operands.fields
        shapes = [_static_dims(x.ty) for x in (a, b)]
        dtypes = {str(getattr(x.ty, "dtype", "")) for x in (a, b)}
        if None in shapes or len(dtypes) != 1:
            return call
        steps = einsum_as_matmul(str(call.attrs.subscripts), *shapes)
        if steps is None:
            return call
        emit = self.builder_.normalize

        def arrange(x: relax.Expr, perm: list[int], shape: list[int]) -> relax.Expr:
            if perm != sorted(perm):
                x = emit(relax.op.permute_dims(x, perm))
            return x if _static_dims(x.ty) == shape else emit(relax.op.reshape(x, shape))

        product = emit(relax.op.matmul(arrange(a, steps.perm_a, steps.shape_a), arrange(b, steps.perm_b, steps.shape_b)))
        if _static_dims(product.ty) != steps.unflat:
            product = emit(relax.op.reshape(product, steps.unflat))
        return product if steps.perm_out == sorted(steps.perm_out) else emit(relax.op.permute_dims(product, steps.perm_out))

    def _quantize(self, call: relax.Call) -> relax.Expr:
        """As TVM's legalisation computes them: (x - zero) * scale, the difference in int32;
        clip(round(x / scale) + zero) cast to the quantized type. (VectorMath later divides by a
        constant scale as a product with its reciprocal: one ulp, which may round a value lying
        within an ulp of a half step the other way.)"""
        x, scale, zero = call.args
        dtype, out_dtype, ndim = str(x.ty.dtype), str(call.attrs.out_dtype), x.ty.ndim
        if ndim < 0 or str(scale.ty.dtype) != "float32":
            return call
        scale, zero = self._along(scale, call.attrs.axis, ndim), self._along(zero, call.attrs.axis, ndim)
        emit = self.builder_.normalize
        if call.op.name == "relax.dequantize":
            if out_dtype != "float32":
                return call
            whole = self._whole_float(x)
            if whole is not None and 0 < tvm.DataType(str(zero.ty.dtype)).bits <= 16:
                # dequantize(quantize(x)), a QDQ pair: the whole float less the zero point, in
                # float (exact: both whole and within 16 bits), without the round trip through
                # the integer type (three casts per element)
                diff = emit(relax.op.subtract(whole, emit(relax.op.astype(zero, "float32"))))
                return emit(relax.op.multiply(diff, scale))
            wide = "float32" if dtype.startswith("float") else "int32"
            diff = emit(relax.op.subtract(emit(relax.op.astype(x, wide)), emit(relax.op.astype(zero, wide))))
            return emit(relax.op.multiply(emit(relax.op.astype(diff, "float32")), scale))
        if dtype != "float32" or "int" not in out_dtype:
            return call
        y = emit(relax.op.round(emit(relax.op.divide(x, scale))))
        y = emit(relax.op.add(y, emit(relax.op.astype(zero, "float32"))))
        lo, hi = (float(v) for v in (tirx.min_value(out_dtype).value, tirx.max_value(out_dtype).value))
        y = emit(relax.op.minimum(emit(relax.op.maximum(y, _c(lo, "float32"))), _c(hi, "float32")))
        cast = emit(relax.op.astype(y, out_dtype))
        if tvm.DataType(out_dtype).bits <= 16:  # a whole float of at most 16 bits converts exactly
            self.quantized.append((cast, cast.args[0]))  # the normaliser bound y to a variable
        return cast

    def _whole_float(self, x: relax.Expr | None) -> relax.Expr | None:
        """For a quantize's result, the whole float it cast to its integer type (see _quantize)."""
        value = self.lookup_binding(x) if isinstance(x, relax.Var) else None
        return next((y for cast, y in self.quantized if value is not None and value.same_as(cast)), None)

    def _along(self, param: relax.Expr, axis: int, ndim: int) -> relax.Expr:
        """A per-axis parameter (n,) reshaped to broadcast along `axis` of an ndim-D tensor."""
        shape = [int(d) for d in param.ty.shape.values] if param.ty.ndim == 1 else []
        if len(shape) != 1 or shape[0] == 1:
            return param
        axis = int(axis) % ndim
        return self.builder_.normalize(relax.op.reshape(param, [1] * axis + shape + [1] * (ndim - axis - 1)))


class MatmulSteps(NamedTuple):
    """An einsum as a batched matmul: each operand permuted to [batch, free, contracted] (B: [batch,
    contracted, free]) and reshaped to [*batch, rows, k] ([*batch, k, columns]); the product
    reshaped to [*batch, *rows, *columns], then permuted to the einsum's output order."""

    perm_a: list[int]
    shape_a: list[int]
    perm_b: list[int]
    shape_b: list[int]
    unflat: list[int]
    perm_out: list[int]


def einsum_as_matmul(equation: str, shape_a: list[int], shape_b: list[int]) -> MatmulSteps | None:
    """The matmul an einsum of two operands computes, or None where it is not one: every letter
    of an operand must be a batch axis (in both operands and the output), a free axis (in one
    operand and the output) or contracted (in both operands, not the output), with at least one
    contracted; no letter twice in a term, no ellipsis. Implicit output (no '->'): the letters
    that appear once, sorted, as ONNX and numpy define it."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if "." in eq or len(terms) != 2 or not all(t.isalpha() for t in terms) or (out and not out.isalpha()):
        return None
    ta, tb = terms
    if not arrow:
        out = "".join(sorted(c for c in set(ta + tb) if (ta + tb).count(c) == 1))
    if any(len(set(t)) != len(t) for t in (ta, tb, out)) or len(ta) != len(shape_a) or len(tb) != len(shape_b):
        return None
    size = dict(zip(ta, shape_a))
    if any(size.setdefault(c, n) != n for c, n in zip(tb, shape_b)) or not set(out) <= set(ta + tb):
        return None
    batch = [c for c in out if c in ta and c in tb]
    rows = [c for c in out if c in ta and c not in tb]
    columns = [c for c in out if c in tb and c not in ta]
    contracted = [c for c in ta if c in tb and c not in out]
    if not contracted or len(batch) + len(rows) + len(contracted) != len(ta) or \
            len(batch) + len(columns) + len(contracted) != len(tb):
        return None  # no contraction (an outer product), or an axis summed within one operand
    dims = [size[c] for c in batch]
    k = math.prod(size[c] for c in contracted)
    m, n = math.prod(size[c] for c in rows), math.prod(size[c] for c in columns)
    flat = batch + rows + columns
    return MatmulSteps(
        perm_a=[ta.index(c) for c in batch + rows + contracted], shape_a=[*dims, m, k],
        perm_b=[tb.index(c) for c in batch + contracted + columns], shape_b=[*dims, k, n],
        unflat=[size[c] for c in flat], perm_out=[flat.index(c) for c in out],
    )


def _static_dims(ty: object) -> list[int] | None:
    """A tensor type's dimensions, or None unless all are known integers."""
    shape = getattr(ty, "shape", None)
    if getattr(ty, "ndim", -1) < 1 or shape is None:
        return None
    dims = [getattr(d, "value", None) for d in shape.values]
    return dims if all(isinstance(d, int) for d in dims) else None


def _constant_indices(indices: relax.Expr, size: int) -> np.ndarray | None:
    """Constant indices into an axis of `size`, negative ones counted from its end; None if they
    are not constants or not all within the axis (left to the op's own rule for those)."""
    if not isinstance(indices, tvm.ir.expr.GenericConst):
        return None
    return _within(indices.value.numpy(), size)


def _within(picked: np.ndarray, size: int) -> np.ndarray | None:
    """Indices into an axis of `size`, negative ones counted from its end; None unless all are
    within the axis."""
    if picked.size == 0 or np.any(picked < -size) or np.any(picked >= size):
        return None
    return np.where(picked < 0, picked + size, picked).astype(np.int64)


def _in_steps(picked: np.ndarray) -> tuple[int, int] | None:
    """(first, step) of 1-D indices that go up in equal steps of one or more; None otherwise."""
    step = int(picked[1] - picked[0]) if picked.size > 1 else 1
    if step < 1 or np.any(np.diff(picked) != step):
        return None
    return int(picked[0]), step


def _indexed_by_constants(mod: tvm.IRModule, ops: tuple[str, ...]) -> bool:
    """Whether a call of `ops` reads run-time data at indices computed from constants alone
    (which FoldConstant makes constants): a binding is constant-derived when its value is a
    constant, a call, tuple or tuple item of constant-derived values only, or the shape of a
    tensor of static shape."""
    leaves = (tvm.ir.expr.Constant, relax.ShapeExpr)  # tensors, shapes, PrimValues, strings, dtypes
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        derived: set[relax.Var] = set()

        def known(e: relax.Expr) -> bool:
            if isinstance(e, relax.Tuple):
                return all(known(f) for f in e.fields)
            return isinstance(e, leaves) or (isinstance(e, relax.Var) and e in derived)

        for block in func.body.blocks:
            for b in block.bindings:
                v = b.value if isinstance(b, relax.VarBinding) else None
                if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
                    if v.op.name in ops and known(v.args[1]) and not known(v.args[0]):
                        return True
                    # the shape of a static tensor (ScatterND's wrap of negative indices)
                    static = v.op.name == "relax.shape_of" and _static_dims(v.args[0].ty) is not None
                    if static or all(known(a) for a in v.args):
                        derived.add(b.var)
                elif v is not None and (known(v) or isinstance(v, relax.TupleGetItem) and known(v.tuple_value)):
                    derived.add(b.var)
    return False


@relax.expr_functor.mutator
class _ConstantIndexRewriter(relax.PyExprMutator):
    """take() and scatter_elements() at constant indices, as the injective ops they compute
    (see ConstantIndexing)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
            return call
        if call.op.name == "relax.take":
            return self._take(call)
        if call.op.name == "relax.scatter_elements":
            return self._scatter(call)
        if call.op.name == "relax.scatter_nd":
            return self._scatter_block(call)
        return call

    def _take(self, call: relax.Call) -> relax.Expr:
        """Indices in steps of one or more (a scalar, or a vector): a strided slice, as one op
        (strided_slice + squeeze would be two)."""
        x, indices = call.args
        dims, shape = _static_dims(x.ty), _static_dims(call.ty)
        if dims is None or shape is None or call.attrs.axis is None:
            return call
        axis = int(call.attrs.axis) % len(dims)
        picked = _constant_indices(indices, dims[axis])
        if picked is None or picked.ndim > 1:
            return call
        kept, steps = picked.ndim == 1, _in_steps(picked.reshape(-1))
        if steps is None:
            return call
        first, step = steps

        def sliced(data: tvm.te.Tensor) -> tvm.te.Tensor:
            def element(*i):
                at = first + step * i[axis] if kept else first
                return data[(*i[:axis], at, *i[axis + int(kept):])]

            return tvm.te.compute(shape, element, name="T_take")

        return self.builder_.call_te(sliced, x, primfunc_name_hint="take_slice")

    def _scatter(self, call: relax.Call) -> relax.Expr:
        """One slice along the axis overwritten (`out[:, t] = y`, a scan's output written a step
        at a time: RWKV's 32 per layer): the updates where the index is that slice's, the data
        elsewhere."""
        data, indices, updates = call.args
        dims, given = _static_dims(data.ty), _static_dims(updates.ty)
        if dims is None or given is None or len(given) != len(dims) or str(call.attrs.reduction) != "update":
            return call
        axis = int(call.attrs.axis) % len(dims)
        picked = _constant_indices(indices, dims[axis])
        if picked is None or list(picked.shape) != given or np.any(picked != picked.flat[0]):
            return call
        if given[axis] != 1 or any(g != d for k, (g, d) in enumerate(zip(given, dims)) if k != axis):
            return call
        at = int(picked.flat[0])

        def overwritten(old: tvm.te.Tensor, new: tvm.te.Tensor) -> tvm.te.Tensor:
            def element(*i):
                return tirx.Select(i[axis] == at, new[(*i[:axis], 0, *i[axis + 1:])], old[i])

            return tvm.te.compute(dims, element, name="T_scatter")

        return self.builder_.call_te(overwritten, data, updates, primfunc_name_hint="scatter_slice")

    def _scatter_block(self, call: relax.Call) -> relax.Expr:
        """A block overwritten at constant indices in steps (`x[a:b] = y`, `x[:, a:b] = y`: ONNX
        ScatterND whose (*B, M) indices enumerate, in order, a grid of B[j] positions in steps
        along each of the first M axes; Funnel's relative-position shift, four of them 240 of its
        453 us of kernel time as TVM's serial loop): the updates inside the block, the data
        elsewhere."""
        data, indices, updates = call.args
        dims, given, shape = _static_dims(data.ty), _static_dims(updates.ty), _static_dims(indices.ty)
        if dims is None or given is None or shape is None or str(call.attrs.reduction) != "update":
            return call
        counts, axes = shape[:-1], shape[-1]
        if not 1 <= axes <= len(dims) or len(counts) != axes or given != [*counts, *dims[axes:]]:
            return call
        if not isinstance(indices, tvm.ir.expr.GenericConst):
            return call
        coords = indices.value.numpy().astype(np.int64)
        grid = np.indices(counts)
        first, step = [], []
        for j in range(axes):  # coordinate j: in steps along axis j of the grid, the same across it
            picked = _within(coords[..., j], dims[j])
            along = tuple(slice(None) if a == j else 0 for a in range(axes))
            steps = None if picked is None else _in_steps(picked[along])
            if steps is None or np.any(picked != steps[0] + steps[1] * grid[j]):
                return call
            first.append(steps[0])
            step.append(steps[1])

        def overwritten(old: tvm.te.Tensor, new: tvm.te.Tensor) -> tvm.te.Tensor:
            def element(*i):
                inside, at = [], []
                for j in range(axes):
                    k = tirx.indexdiv(i[j] - first[j], step[j])
                    inside += [i[j] >= first[j], tirx.indexmod(i[j] - first[j], step[j]) == 0, k < counts[j]]
                    at.append(tirx.min(tirx.max(k, 0), counts[j] - 1))  # in bounds where not read
                return tirx.Select(tirx.all(*inside), new[(*at, *i[axes:])], old[i])

            return tvm.te.compute(dims, element, name="T_scatter")

        return self.builder_.call_te(overwritten, data, updates, primfunc_name_hint="scatter_block")


@tvm.transform.module_pass(opt_level=0, name="AutofuseConstantIndexing")
class ConstantIndexing:
    """Gathers and scatters at constant indices as the injective ops they compute: a take()
    whose indices are constants in steps (`x[:, i]` exported as ONNX Gather, a scan unrolled by
    the exporter, Mamba's 32 per layer) as a strided slice; a scatter_elements() that overwrites
    one slice along its axis (RWKV's), and a scatter_nd() that overwrites a block in steps
    (Funnel's rows), as selects. TVM marks them opaque, since they read their
    indices from a tensor at run time, so FuseOps, and every plan, left each one a kernel of its
    own (257 of Mamba's 688 ops, each a VM call); rewritten, they fuse with the ops around them."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _rewrite_functions(mod, _ConstantIndexRewriter)


@tvm.transform.module_pass(opt_level=0, name="AutofuseLayoutFriendlyOps")
class LayoutFriendlyOps:
    """Ops that ConvertLayout has no rule for in TVM 0.27, rewritten as the elementwise ops they
    compute, which it carries channels-last: clip (ONNX HardSigmoid, HardSwish), leaky ReLU,
    quantize and dequantize (a QDQ int8 model's, or a QOperator one's rewritten by onnx_qlinear);
    transposed convolutions with stride = kernel, and einsums that are batched matmuls, as a
    matmul (see _upsampling_matmul, _einsum_matmul).
    Casts to the type their input has are dropped; squeeze and permute_dims get their axes
    counted from the front (ConvertLayout fails on negative ones, see _axes_from_zero), and
    stack becomes the concatenation of expanded inputs it computes (its layout rule fails).
    Left as they are, each gets a transpose on either side between two convolutions (int8
    ResNet-50: 2 per convolution), and FuseOps cannot fuse them into the convolutions' epilogues."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _rewrite_functions(mod, _LayoutRewriter)


# output channels are padded to a multiple of this (see WholeVectorChannels): half an AVX-512
# register, a whole AVX2 one
CHANNEL_MULTIPLE = 8


def whole_tile_columns(columns: int) -> int:
    """The column count, at least `columns`, of whole register tiles two or three vectors wide
    (a multiple of 2 or 3 x CHANNEL_MULTIPLE): with an odd number of vectors that 3 does not
    divide, a matmul over several rows gets tiles one vector wide, which need a broadcast load
    per multiply-add (a CRNN's 32 x 1024 x 8210 output layer as 8216 = 8 x 1027 columns in 8 x 1
    tiles: 4.5 ms alone; 8224 columns in 4 x 2 tiles: 3.1 ms)."""
    n = columns + -columns % CHANNEL_MULTIPLE
    while n % (2 * CHANNEL_MULTIPLE) and n % (3 * CHANNEL_MULTIPLE):
        n += CHANNEL_MULTIPLE
    return n


def _whole_vectors(columns: int) -> int:
    return columns + (-columns % CHANNEL_MULTIPLE if columns % 4 else 0)


def conv_channels(channels: int, taps: int) -> int:
    """The output channels a 2-D convolution with `taps` multiply-adds per output (input
    channels x kernel area) is computed over: above 32 channels and 64 taps, a multiple of two
    CHANNEL_MULTIPLEs (a whole AVX-512 vector), else of one where 4 does not divide the count.
    The register tiles of a count that 16 does not divide take vectors of 8 lanes on AVX-512,
    one vector wide where the number of them is prime: RetinaNet's head, 3x3 from 256 channels
    on 50x50, into 9 x 91 classes (824 once padded to 8) 94 ms, into 832 44 ms; into 9 x 4 box
    coordinates 36: 4.3 ms, 48: 2.1 ms; 40, 72, 200, 840 channels 1.2-1.4x slower than 48, 80,
    208, 848 (1x1 on 28x28 from 240: 1.0-1.15x; `scripts/ragged_shapes.py channels`). With few
    taps the output's writes cost more than the arithmetic, and each pixel's last, partial
    vector of the sliced output is stored lane by lane: Faster R-CNN-MobileNetV3's 1x1 24 -> 72
    on 80x80 ran 0.26 ms, 0.50 as 80 (`vm_profile.py`); at 24 channels the extra third of the
    work costs what it gains."""
    if channels > 4 * CHANNEL_MULTIPLE and taps >= 8 * CHANNEL_MULTIPLE:
        return channels + -channels % (2 * CHANNEL_MULTIPLE)
    return _whole_vectors(channels)


@relax.expr_functor.mutator
class _ChannelPadder(relax.PyExprMutator):
    """Convolutions and constant-weight matmuls with whole vectors of output channels (see
    WholeVectorChannels)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
            return call
        if (call.op.name in _CONVOLUTIONS and int(call.attrs.groups) == 1
                and call.args[1].ty.ndim == call.args[0].ty.ndim):
            # 1-D too: Silero VAD's STFT as a 256-tap convolution into 258 channels, 757 us as
            # a dot product per output (its LSTM model 0.84 -> 0.14 ms)
            layout = str(call.attrs.out_layout or call.attrs.data_layout)
            # one output channel vectorises along the image instead (64 -> 1 on 64x64: 379 us
            # as it is; 2 or 3 channels 1462-1582 us, padded to 8 405-425 us)
            o_axis = str(call.attrs.kernel_layout).index("O")
            dims = [getattr(d, "value", None) for d in call.args[1].ty.shape.values]
            taps = math.prod(d for k, d in enumerate(dims) if k != o_axis) if None not in dims else 0
            pad_to = _whole_vectors
            if call.op.name == "relax.nn.conv2d":
                pad_to = lambda c: conv_channels(c, taps)  # noqa: E731
            return self._pad(call, o_axis, layout.index("C"), 2, pad_to)
        if (call.op.name == "relax.matmul" and isinstance(call.args[1], tvm.ir.expr.GenericConst)
                and call.args[1].ty.ndim == 2):
            # up to SERIAL_INNER columns run as serial accumulators inside the reduction
            shape = [getattr(d, "value", None) for d in call.ty.shape.values]
            rows = math.prod(shape[:-1]) if all(isinstance(d, int) for d in shape[:-1]) else 0
            return self._pad(call, 1, call.ty.ndim - 1, SERIAL_INNER + 1,
                             whole_tile_columns if rows >= 4 else _whole_vectors)
        return call

    def _pad(
        self, call: relax.Call, w_axis: int, out_axis: int, least: int, pad_to: Callable[[int], int]
    ) -> relax.Expr:
        weight = call.args[1]
        shape = [getattr(d, "value", None) for d in call.ty.shape.values] if call.ty.ndim > 0 else []
        channels = shape[out_axis] if shape else None
        if not isinstance(channels, int) or channels < least:
            return call
        padded_to = pad_to(channels)
        if padded_to == channels:
            return call
        emit = self.builder_.normalize
        widths = [0] * (2 * weight.ty.ndim)
        widths[2 * w_axis + 1] = padded_to - channels
        padded = emit(relax.Call(call.op, [call.args[0], emit(relax.op.nn.pad(weight, widths)), *call.args[2:]],
                                 call.attrs))
        return emit(relax.op.strided_slice(padded, [out_axis], [0], [channels]))


@tvm.transform.module_pass(opt_level=0, name="AutofuseWholeVectorChannels")
class WholeVectorChannels:
    """Convolutions whose output channels no vector width divides (a detection head's 255 =
    3 x (80 + 5), 21 segmentation classes, 3 colours), and matmuls with such a number of
    constant columns, computed over zero weights up to a multiple of CHANNEL_MULTIPLE and sliced
    back: the register tiles need whole vectors of output channels, and without them a kernel
    falls back to one dot product per output (a 3x3 convolution of 64 -> 255 channels on a
    20x20 image: 33.6 ms, 0.79 ms padded, 0.93 ms for 256 channels; `scripts/ragged_shapes.py channels`).
    1-D convolutions likewise. A matmul over 4 or more rows also pads to an even number of
    vectors or a multiple of 3 (whole_tile_columns), so that its register tiles are wider than
    one vector; a 2-D convolution into more than 32 channels with 64 taps or more, to whole
    AVX-512 vectors (conv_channels). The padding of constant weights folds at compile time; the
    slice is the convolution's epilogue."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _rewrite_functions(mod, _ChannelPadder)


@relax.expr_functor.mutator
class _RowPadder(relax.PyExprMutator):
    """1-D convolutions with whole register tiles of output positions (see WholeTileRows)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not calls_op(call, "relax.nn.conv1d"):
            return call
        axis = str(call.attrs.out_layout or call.attrs.data_layout).index("W")
        width = getattr(call.ty.shape.values[axis], "value", None) if call.ty.ndim == 3 else None
        computed = whole_tile_rows(width) if isinstance(width, int) else width
        if computed == width:
            return call
        # n more output positions from n strides more of zeros on the right
        extra = (computed - width) * int(call.attrs.strides[0])
        left, right = (int(p) for p in call.attrs.padding)
        a = call.attrs
        emit = self.builder_.normalize
        padded = emit(relax.op.nn.conv1d(
            call.args[0], call.args[1], a.strides, [left, right + extra], a.dilation, a.groups,
            a.data_layout, a.kernel_layout, a.out_layout, a.out_dtype))
        return emit(relax.op.strided_slice(padded, [axis], [0], [width]))


@tvm.transform.module_pass(opt_level=0, name="AutofuseWholeTileRows")
class WholeTileRows:
    """1-D convolutions whose output positions no register tile divides (wav2vec2's 1599, 799,
    199 frames) computed over a few more positions of zero padding and sliced back: with a
    predicated last tile every tile kept its accumulators in memory (512 -> 512 channels,
    3 taps, stride 2, 199 positions: 2.7 ms, 2.0 ms over 200; `scripts/ragged_shapes.py
    frames`). 2-D convolutions are not padded: their tiles take rows across image rows."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _rewrite_functions(mod, _RowPadder)


def _outputs(size: int, kernel: int, stride: int, dilation: int, before: int, after: int) -> int:
    """Output positions of a convolution along one axis."""
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def _static_convolution(call: relax.Expr) -> tuple | None:
    """(attrs, data, weight, data dims, weight dims, spatial axes, padding) of a convolution
    call whose shapes are known, its padding given per spatial axis before and after; None for
    any other call."""
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)) or call.op.name not in _CONVOLUTIONS:
        return None
    a, (data, weight) = call.attrs, call.args
    dims, wdims = _static_dims(data.ty), _static_dims(weight.ty)
    spatial = [c for c in str(a.data_layout) if c.isupper() and c not in "NC"]
    pads = [int(p) for p in a.padding]
    if dims is None or wdims is None or len(pads) != 2 * len(spatial):
        return None
    return a, data, weight, dims, wdims, spatial, pads


def live_taps(
    size: int, kernel: int, stride: int, dilation: int, before: int, after: int
) -> tuple[int, int, int, int] | None:
    """Along one axis of a convolution: (first tap, taps, padding before, padding after) of the
    smallest kernel computing the same outputs, leaving out taps that read only padding at
    every output position; None where every tap reads the input somewhere."""
    out = _outputs(size, kernel, stride, dilation, before, after)
    live = [i for i, (_, count) in enumerate(tap_outputs(size, kernel, stride, dilation, before, after)) if count]
    if not live or (live[0] == 0 and live[-1] == kernel - 1):
        return None
    first, taps = live[0], live[-1] - live[0] + 1
    new_before = before - first * dilation
    new_after = (out - 1) * stride + dilation * (taps - 1) + 1 - size - new_before
    return (first, taps, new_before, new_after) if new_before >= 0 and new_after >= 0 else None


@relax.expr_functor.mutator
class _TapTrimmer(relax.PyExprMutator):
    """Convolutions without the taps that read only padding (see LiveTaps)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        conv = _static_convolution(call)
        if conv is None:
            return call
        a, data, weight, dims, wdims, spatial, pads = conv
        make = _CONVOLUTIONS[call.op.name]
        data_layout, kernel_layout = str(a.data_layout), str(a.kernel_layout)
        before, after = pads[: len(spatial)], pads[len(spatial):]
        begin, end = [0] * len(wdims), list(wdims)
        for k, axis in enumerate(spatial):
            w_axis = kernel_layout.index(axis)
            trimmed = live_taps(dims[data_layout.index(axis)], wdims[w_axis], int(a.strides[k]), int(a.dilation[k]),
                                before[k], after[k])
            if trimmed is not None:
                begin[w_axis], taps, before[k], after[k] = trimmed
                end[w_axis] = begin[w_axis] + taps
        if end == wdims and not any(begin):
            return call
        emit = self.builder_.normalize
        live = emit(relax.op.strided_slice(weight, list(range(len(wdims))), begin, end))
        return emit(make(data, live, a.strides, before + after, a.dilation, a.groups, data_layout, kernel_layout,
                         a.out_layout, a.out_dtype))


@tvm.transform.module_pass(opt_level=0, name="AutofuseLiveTaps")
class LiveTaps:
    """Convolutions computed without their taps that read only zero padding at every output
    position: an atrous convolution whose dilation exceeds the image (DeepLabV3's ASPP at
    224x224, rates 24 and 36 on a 14x14 map, is a 1x1 convolution), or a 7x7 kernel over a 2x2
    map. TVM pads the input first and runs every tap: a 3x3 960 -> 256 convolution of
    dilation 36 on 14x14 took 5.5 ms over a padded 86x86 image, 0.63 ms as the 1x1 it equals
    (`scripts/ragged_shapes.py dilation`)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _rewrite_functions(mod, _TapTrimmer)


# a convolution is split tap by tap (TapsApart) where its dense form runs at least this many
# times the multiply-adds, in at most this many convolutions (`scripts/ragged_shapes.py apart`,
# 3x3: 960 -> 256 on 14x14, dilation 12, 5.4 times, 3.6x faster split; dilation 6, 1.96 times,
# 1.3x; 512 -> 256 with padding 1 on 7x7, 1.22 times, 0.5-0.8x)
TAPS_APART_GAIN = 1.75
MAX_TAPS_APART = 9
# nor over fewer output positions than this: reading its weights dominates (every tap's once
# either way), and split it only launches more kernels (3x3 512 -> 256 with padding 1 on 2x2,
# 2.25 times: 71.4 us dense, 71.8 split)
TAPS_APART_OUTPUTS = 64
# an axis along which the taps are kept together where splitting them leaves out less (a 3x3
# convolution with padding 1 on a 14-pixel axis: 1.05 times)
AXIS_APART_GAIN = 1.25


def tap_outputs(size: int, kernel: int, stride: int, dilation: int, before: int, after: int) -> list[tuple[int, int]]:
    """Along one axis of a convolution: for each tap, the output positions at which it reads
    the input rather than padding, as (first, count); a contiguous range, since tap i reads
    input r * stride + i * dilation - before at output r."""
    out = _outputs(size, kernel, stride, dilation, before, after)
    ranges = []
    for i in range(kernel):
        first = max(0, -((i * dilation - before) // stride))  # ceil((before - i * dilation) / stride)
        last = min(out - 1, (size - 1 + before - i * dilation) // stride)
        ranges.append((first, max(0, last - first + 1)))
    return ranges


@relax.expr_functor.mutator
class _TapSplitter(relax.PyExprMutator):
    """Convolutions computed as sums of their taps, each over the outputs it reads the input
    at (see TapsApart)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        conv = _static_convolution(call)
        out_dims = _static_dims(call.ty) if conv is not None else None
        if out_dims is None:
            return call
        a, data, weight, dims, wdims, spatial, pads = conv
        data_layout, kernel_layout = str(a.data_layout), str(a.kernel_layout)
        out_layout = str(a.out_layout) or data_layout
        taps = [tap_outputs(dims[data_layout.index(axis)], wdims[kernel_layout.index(axis)], int(a.strides[k]),
                            int(a.dilation[k]), pads[k], pads[len(spatial) + k]) for k, axis in enumerate(spatial)]
        outs = [out_dims[out_layout.index(axis)] for axis in spatial]
        split = _axes_to_split(taps, outs) if math.prod(outs) >= TAPS_APART_OUTPUTS else ()
        if not split:
            return call
        emit = self.builder_.normalize
        parts = []
        for chosen in itertools.product(*[[(i, r) for i, r in enumerate(taps[k]) if r[1]] if k in split else [None]
                                          for k in range(len(spatial))]):
            begin, end, wbegin, wend = [0] * len(dims), list(dims), [0] * len(wdims), list(wdims)
            part_pads, widths = list(pads), [0] * (2 * len(out_dims))
            for k, tap in enumerate(chosen):
                if tap is None:
                    continue
                i, (first, count) = tap
                d, w, o = data_layout.index(spatial[k]), kernel_layout.index(spatial[k]), out_layout.index(spatial[k])
                stride, offset = int(a.strides[k]), i * int(a.dilation[k]) - pads[k]
                begin[d], end[d] = first * stride + offset, (first + count - 1) * stride + offset + 1
                wbegin[w], wend[w] = i, i + 1
                part_pads[k] = part_pads[len(spatial) + k] = 0
                widths[2 * o], widths[2 * o + 1] = first, out_dims[o] - first - count
            part = emit(_CONVOLUTIONS[call.op.name](
                emit(relax.op.strided_slice(data, list(range(len(dims))), begin, end)),
                emit(relax.op.strided_slice(weight, list(range(len(wdims))), wbegin, wend)),
                a.strides, part_pads, a.dilation, a.groups, data_layout, kernel_layout, a.out_layout, a.out_dtype))
            parts.append(emit(relax.op.nn.pad(part, widths)) if any(widths) else part)
        total = parts[0]
        for part in parts[1:]:
            total = emit(relax.op.add(total, part))
        return total


def _axes_to_split(taps: list[list[tuple[int, int]]], outs: list[int]) -> tuple[int, ...]:
    """The spatial axes along which a convolution's taps are best computed apart (see
    TapsApart): among the axes along which the dense form runs at least AXIS_APART_GAIN times
    the multiply-adds, the set leaving out the most, in at most MAX_TAPS_APART convolutions, if
    the dense form runs at least TAPS_APART_GAIN times as many; else none."""
    gains, counts = {}, {}
    for k, ranges in enumerate(taps):
        live = sum(count for _, count in ranges)
        if live and outs[k] * len(ranges) >= AXIS_APART_GAIN * live:
            gains[k], counts[k] = outs[k] * len(ranges) / live, sum(1 for _, count in ranges if count)
    best, best_gain = (), 1.0
    for n in range(1, len(gains) + 1):
        for axes in itertools.combinations(sorted(gains), n):
            if math.prod(counts[k] for k in axes) <= MAX_TAPS_APART and math.prod(gains[k] for k in axes) > best_gain:
                best, best_gain = axes, math.prod(gains[k] for k in axes)
    return best if best_gain >= TAPS_APART_GAIN else ()


@tvm.transform.module_pass(opt_level=0, name="AutofuseTapsApart")
class TapsApart:
    """Convolutions whose taps read mostly padding computed as the sum of their taps, each a
    convolution over only the output positions at which it reads the input (no padding), zero
    elsewhere: DeepLabV3's ASPP at 224x224, dilation 12 on a 14x14 map, whose outer taps read
    the image at 2 of 14 rows and columns, runs 18% of its multiply-adds that way (LiveTaps
    leaves it as it is: every tap reads the image somewhere), and reads each tap's weights
    once. Taps are split along the axes where that leaves out the most work, if enough
    (TAPS_APART_GAIN), in at most MAX_TAPS_APART convolutions: an ordinary 3x3 convolution
    with padding 1 keeps 82% of its work on a 7x7 map and is left as it is."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _rewrite_functions(mod, _TapSplitter)


def count_calls(mod: tvm.IRModule, *names: str) -> int:
    """How many calls of the Relax operators `names` the module's Relax functions hold; with no
    names, how many calls of anything (in a lowered module: the VM's instructions for one run,
    about, which build.compile_scheduled counts)."""
    return sum(not names or isinstance(c.op, tvm.ir.Op) and c.op.name in names for c in _relax_calls(mod))


def _relax_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """Every call in the module's Relax functions, nested ones (an If's branches) too."""
    found = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call):
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def _block_by_block(mod: tvm.IRModule, transform: tvm.transform.Pass) -> tuple[tvm.IRModule, str]:
    """`transform`, a pass over dataflow blocks, applied to main; where main has several (the
    ops before and after a detector's If), to each block with convolutions as a function of its
    own, spliced back. TVM's ConvertLayout over the whole function refused SSDlite ("DataflowBlock
    Pass should not rewrite or delete any global-scope Var": the shapes after the If, sized at run
    time, came out of its re-normalisation as other expressions); a block's outputs, which the
    other blocks read, are the variables it keeps. A block over run-time sizes, or one the pass
    fails on, goes with its outputs cast (`_outputs_cast`) and every shape inferred again after
    the pass (`_ShapeReinference`): the pass re-infers sizes as other expressions. A block the
    pass still fails on is kept as it was (before the cast, Keypoint R-CNN's head over a run-time
    number of detections: 80 of its 82 s a run in channels-first convolutions): also returned, a
    note naming the blocks left."""
    main = mod["main"]
    blocks = list(main.body.blocks)
    if sum(isinstance(b, relax.DataflowBlock) for b in blocks) < 2:
        return transform(mod), ""
    failed: list[str] = []
    for k, block in enumerate(blocks):
        if not isinstance(block, relax.DataflowBlock) or not any(
                isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) in _CONVOLUTIONS
                for b in block.bindings):
            continue
        outputs = [b.var for b in block.bindings if not isinstance(b.var, relax.DataflowVar)]
        body = relax.SeqExpr([block], relax.Tuple(outputs))
        params = list(relax.analysis.free_vars(body))
        piece = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != "main"})
        piece["main"] = relax.Function(params, body, relax.TupleType([v.ty for v in outputs]))
        if not any(_run_time_sized(b.var.ty) for b in block.bindings):
            try:
                blocks[k] = transform(piece)["main"].body.blocks[0]
                continue
            except Exception:  # noqa: BLE001 - TVM's pass: tried again with its outputs cast
                pass
        # (a block over run-time sizes at once: the pass may re-infer a size inside it as another
        # expression with no error, which only legalisation then refused: Mask R-CNN v2's concat
        # of min(1000, n) rows with min(1000, n) - min(0, n))
        piece["main"] = relax.Function(params, relax.SeqExpr([_outputs_cast(block)], body.body), piece["main"].ret_ty)
        try:
            converted = transform(piece)["main"]
            blocks[k] = _ShapeReinference().visit_expr(converted).body.blocks[0]
        except Exception as err:  # noqa: BLE001 - TVM's pass: this block keeps its layout
            from autofuse.importer import error_line

            failed.append(f"block {k} ({error_line(err)[:100]})")
    body = relax.SeqExpr(blocks, main.body.body)
    out = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != "main"})
    out["main"] = relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs)
    note = f"channels-last layout not applied to {', '.join(failed)}: its convolutions stay channels-first"
    return out, note if failed else ""


def _outputs_cast(block: relax.DataflowBlock) -> relax.DataflowBlock:
    """`block` with each output `v = f(x)` computed as `v_value = f(x); v = match_cast(v_value)`.

    ConvertLayout re-infers every rewritten call's shape, and where that gives another expression
    for a size (Keypoint R-CNN's detections: `min(20, n)` sliced again came out as
    `min(20, n) - min(0, n)`), the output variable, which later blocks read, is replaced: TVM's
    pass refuses that. Cast to its own type, the variable keeps its identity whatever its value
    is re-inferred as (checked at run time), and reading it restores its layout."""
    bindings = []
    for b in block.bindings:
        if isinstance(b.var, relax.DataflowVar) or not isinstance(b, relax.VarBinding):
            bindings.append(b)
            continue
        value = relax.DataflowVar(f"{b.var.name}_value", b.var.ty)
        bindings += [relax.VarBinding(value, b.value), relax.MatchCast(b.var, value, b.var.ty)]
    return relax.DataflowBlock(bindings)


@relax.expr_functor.mutator
class _ShapeReinference(relax.PyExprMutator):
    """Every operator call's shape inferred again, inside its function: where sizes are known to
    be non-negative. A dataflow-block pass (ConvertLayout) infers without that knowledge
    (`min(20, n) - min(0, n)` for the first 20 rows of n), and an operator reading that beside
    `min(20, n)` is not lowered (LegalizeOps cannot prove the two equal: the VM refused a
    concat)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
            return relax.Call(call.op, call.args, call.attrs, call.ty_args)
        return call


@dataclass
class MainBlock:
    """The main function's first dataflow block, and its call_tir bindings in order."""

    func: relax.Function
    block_index: int
    bindings: list[relax.Binding]
    node_bindings: list[relax.Binding]


def main_block(mod: tvm.IRModule) -> MainBlock:
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError("the module has no 'main' function")
    func = mod["main"]
    if not isinstance(func.body, relax.SeqExpr):
        raise ValueError("main's body is not a sequence of binding blocks")
    for i, block in enumerate(func.body.blocks):
        if isinstance(block, relax.DataflowBlock):
            bindings = list(block.bindings)
            nodes = [b for b in bindings if is_call_tir(b)]
            return MainBlock(func, i, bindings, nodes)
    raise ValueError("main has no dataflow block: nothing to fuse")


def is_call_tir(binding: relax.Binding) -> bool:
    return isinstance(binding, relax.VarBinding) and is_kernel_call(binding.value)


def is_kernel_call(expr: relax.Expr) -> bool:
    """A call of a PrimFunc: call_tir, or the call_tir_inplace that inplace.py makes of one."""
    return isinstance(expr, relax.Call) and (expr.op.same_as(call_tir_op()) or expr.op.same_as(call_tir_inplace_op()))


def _static_shape(ty: object, where: str) -> tuple[tuple[int, ...], str]:
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None:
        raise ValueError(f"{where}: tensor has no known shape; fix the input dimensions")
    try:
        return tuple(int(v) for v in values), str(ty.dtype)
    except TypeError as err:
        raise ValueError(f"{where}: symbolic shape {shape}; fix the input dimensions") from err


def _run_time_sized(ty: object) -> bool:
    """A tensor whose shape names a size known only when the model runs (the boxes a
    NonMaxSuppression keeps, and whatever is computed from them)."""
    values = getattr(getattr(ty, "shape", None), "values", None)
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return any(_run_time_sized(f) for f in fields)
    return values is not None and any(not isinstance(v, tirx.IntImm) for v in values)


def _bounded_shape(ty: object, where: str) -> tuple[tuple[int, ...], str]:
    """_static_shape, a run-time size counted as 1: such kernels only stand alone (a model's
    post-processing after NonMaxSuppression), their sizes serve as cost-model features only."""
    values = getattr(getattr(ty, "shape", None), "values", None)
    if values is not None and _run_time_sized(ty):
        return tuple(int(v) if isinstance(v, tirx.IntImm) else 1 for v in values), str(ty.dtype)
    return _static_shape(ty, where)


def _call_args(call: relax.Call) -> list[relax.Expr]:
    return list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else [call.args[1]]


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    bits = tvm.DataType(dtype).bits * max(tvm.DataType(dtype).lanes, 1)
    return int(np.prod(shape, dtype=np.int64)) * bits // 8


def _flops(mod: tvm.IRModule, gv: tvm.ir.GlobalVar, cache: dict[str, float]) -> float:
    name = gv.name_hint
    if name not in cache:
        from tvm.s_tir.analysis import estimate_tir_flops

        try:
            cache[name] = float(estimate_tir_flops(tvm.IRModule({"main": mod[gv]})))
        except Exception:  # the estimator rejects some loop forms; FLOPs are only a feature
            cache[name] = 0.0
    return cache[name]


def unlowered_ops(mod: tvm.IRModule) -> list[str]:
    """Operators that LegalizeOps was meant to lower but left as they are (TVM has no kernel for
    that variant: conv2d_transpose in NHWC, say), in any block of any function; the VM cannot run
    them, so every plan would fail to build. Named with their layout, where they have one."""
    out = []
    for v in _relax_calls(mod):
        if isinstance(v.op, tvm.ir.Op) and v.op.get_attr("FLegalize") is not None:
            layout = getattr(v.attrs, "data_layout", None) if v.attrs is not None else None
            out.append(f"{v.op.name}" + (f" ({layout})" if layout else ""))
    return sorted(set(out))


def _arg_bytes(arg: relax.Expr) -> int:
    ty = getattr(arg, "ty", None)
    try:
        shape, dtype = _static_shape(ty, "argument")
    except ValueError:
        return 0
    return _nbytes(shape, dtype)


def extract_graph(mod: tvm.IRModule) -> OpGraph:
    """The operator graph of main's dataflow block: one node per call_tir, in binding order.

    Other bindings (tuple construction, tuple indexing, aliases) are transparent: an edge runs
    from each kernel to every kernel that reads its result through them. A call that is not a
    kernel (an op TVM left unlowered, a packed function) cannot join a group: the kernels that
    feed it or read it are marked unfusable, so no group can reach around it (a group holding
    kernels on both sides would form a cycle with it). Kernels with a size known only at run
    time (after a detector's NonMaxSuppression) are unfusable too: they stand alone.
    """
    block = main_block(mod)
    node_of = {id(b): i for i, b in enumerate(block.node_bindings)}
    producers: dict[relax.Var, frozenset[int]] = {}
    params = list(block.func.params)
    readers: list[set[int]] = [set() for _ in params]
    nodes: list[OpNode] = []
    edges: set[tuple[int, int]] = set()
    outputs: set[int] = set()
    flops_cache: dict[str, float] = {}
    opaque_vars: set[relax.Var] = set()  # results of non-kernel calls, and tuples/aliases of them
    pinned: set[int] = set()  # kernels next to a non-kernel call
    for binding in block.bindings:
        used = list(relax.analysis.free_vars(binding.value))
        deps = frozenset().union(*(producers.get(v, frozenset()) for v in used))
        if id(binding) not in node_of:
            producers[binding.var] = deps
            if isinstance(binding.value, relax.Call) or any(v in opaque_vars for v in used):
                opaque_vars.add(binding.var)
                if isinstance(binding.value, relax.Call):
                    pinned.update(deps)
            if not isinstance(binding.var, relax.DataflowVar):
                outputs.update(deps)
            continue
        nid = node_of[id(binding)]
        if any(v in opaque_vars for v in used):
            pinned.add(nid)
        edges.update((d, nid) for d in deps)
        for pi, p in enumerate(params):
            if any(v.same_as(p) for v in used):
                readers[pi].add(nid)
        producers[binding.var] = frozenset([nid])
        if not isinstance(binding.var, relax.DataflowVar):
            outputs.add(nid)
        nodes.append(_make_node(mod, binding, nid, flops_cache))
    _mark_block_outputs(block, producers, outputs)
    nodes = [replace(n, fusable=False) if n.id in pinned else n for n in nodes]
    return OpGraph(
        tuple(nodes),
        tuple(sorted(edges)),
        frozenset(outputs),
        tuple(tuple(sorted(r)) for r in readers),
    )


def _mark_block_outputs(
    block: MainBlock, producers: dict[relax.Var, frozenset[int]], outputs: set[int]
) -> None:
    # results used after the dataflow block (later blocks, the return value) leave it too
    later = list(block.func.body.blocks)[block.block_index + 1 :]
    exprs = [b.value for blk in later for b in blk.bindings] + [block.func.body.body]
    for expr in exprs:
        for v in relax.analysis.free_vars(expr):
            outputs.update(producers.get(v, frozenset()))


def _make_node(
    mod: tvm.IRModule, binding: relax.Binding, nid: int, flops_cache: dict[str, float]
) -> OpNode:
    call = binding.value
    gv = call.args[0]
    prim = mod[gv]
    kind_value = int(prim.attrs["op_pattern"]) if "op_pattern" in prim.attrs else 8
    kind = OpKind(kind_value) if kind_value in OpKind._value2member_map_ else OpKind.OPAQUE
    var = binding.var
    tuple_out = not hasattr(var.ty, "shape")
    sized = _run_time_sized(var.ty) or any(_run_time_sized(getattr(a, "ty", None)) for a in _call_args(call))
    if tuple_out:
        shape, dtype, out_bytes = (), "tuple", 0
        for field in var.ty.fields:
            fshape, fdtype = _bounded_shape(field, var.name)
            out_bytes += _nbytes(fshape, fdtype)
    else:
        shape, dtype = _bounded_shape(var.ty, var.name)
        out_bytes = _nbytes(shape, dtype)
    args = _call_args(call)
    return OpNode(
        id=nid,
        name=var.name,
        op=gv.name_hint,
        kind=kind,
        shape=shape,
        dtype=dtype,
        flops=_flops(mod, gv, flops_cache),
        bytes_in=sum(_arg_bytes(a) for a in args),
        bytes_out=out_bytes,
        fusable=kind not in (OpKind.OPAQUE, OpKind.TUPLE) and not sized,
    )


def structural_key(mod: tvm.IRModule) -> str:
    """Hex structural hash of the module: the workload identity used in logs."""
    from tvm_ffi import structural_hash

    h = structural_hash(mod) & 0xFFFFFFFFFFFFFFFF
    return hashlib.sha256(str(h).encode()).hexdigest()[:16]


def fuseops_plan(mod: tvm.IRModule, graph: OpGraph) -> FusionPlan:
    """The grouping TVM's own FuseOps makes on `mod`, read back as a FusionPlan.

    Each kernel call first gets a PrimFunc of its own (a copy tagged with its node id), so the
    calls inside FuseOps' grouped functions can be told apart; grouping does not depend on
    function identity, only on op patterns and the dataflow.
    """
    tagged = _tag_nodes(mod)
    fused = relax.transform.FuseOps()(tagged)
    groups: list[list[int]] = []
    for binding in main_block(fused).bindings:
        value = binding.value
        if is_call_tir(binding):
            groups.append([_node_tag(fused[value.args[0]])])
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            inner = fused[value.op]
            if isinstance(inner, relax.Function) and inner.attrs is not None and "Primitive" in inner.attrs:
                groups.append([_node_tag(fused[b.value.args[0]]) for b in _calls_in(inner)])
    found = {n for g in groups for n in g}
    groups.extend([n] for n in range(len(graph)) if n not in found)
    # unfusable kernels stand alone here too: FuseOps groups those of run-time sizes (a small share)
    groups = [part for g in groups
              for part in ([g] if all(graph.nodes[n].fusable for n in g) else [[n] for n in g])]
    return FusionPlan.from_groups(groups, "tvm_default")


_TAG = "autofuse_node"


def _node_tag(prim: tirx.PrimFunc) -> int:
    return int(prim.attrs[_TAG])


def constant_params(mod: tvm.IRModule) -> dict[str, tuple[list[int], bool]]:
    """For each PrimFunc, the parameters to which every call_tir in the module's Relax functions
    passes a constant (weights bound at import): the parameters its schedule may re-lay
    (schedule._pack_weights), since `repack_constants` can then re-lay the values once, here;
    and whether each constant passed comes at two calls or more (an unrolled recurrence's
    weights, at every step): read from cache but at the first of those calls, where a model's
    other weights come from memory."""
    seen: dict[str, set[int]] = {}
    passed: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, fields in _kernel_calls(mod):
        consts = {i for i, a in enumerate(fields) if isinstance(a, tvm.ir.expr.GenericConst)}
        seen[name] = seen[name] & consts if name in seen else consts
        # a constant is one object wherever the module passes it; objects hash by identity
        passed[name].update(fields[i] for i in consts)
    return {name: (sorted(idx), min(passed[name].values()) > 1) for name, idx in seen.items() if idx}


def _kernel_calls(mod: tvm.IRModule) -> Iterator[tuple[str, list[relax.Expr]]]:
    """(callee name, arguments) of every call_tir in the module's Relax functions."""
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for binding in _calls_in(func):
            callee, args = binding.value.args[0], binding.value.args[1]
            yield callee.name_hint, list(args.fields) if isinstance(args, relax.Tuple) else [args]


def repack_constants(
    mod: tvm.IRModule, packed: dict[str, list[tuple[int, int]]], pack: Callable[[np.ndarray, int], np.ndarray]
) -> tvm.IRModule:
    """Replace each constant that a call passes to a re-laid parameter of kernel `name`
    (packed[name]: (parameter index, panel width) pairs) by pack(value, width).

    The re-laid kernels get new GlobalVars of the same names: a GlobalVar carries the signature
    its function had when first added, which Relax checks calls against (and which other
    modules sharing it, such as the unscheduled one, still need)."""
    retyped = {}
    for name in packed:
        bb = relax.BlockBuilder()  # an empty module: the name is kept
        retyped[name] = bb.add_func(mod[name], name)

    @relax.expr_functor.mutator
    class Repacker(relax.PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            new = super().visit_call_(call)
            if not (is_kernel_call(new) and new.args[0].name_hint in packed):
                return new
            name = new.args[0].name_hint
            fields = list(new.args[1].fields)
            for k, width in packed[name]:
                if not isinstance(fields[k], tvm.ir.expr.GenericConst):
                    raise ValueError(f"kernel {name} re-lays parameter {k}, given a non-constant")
                fields[k] = relax.const(pack(fields[k].value.numpy(), width))
            return relax.Call(new.op, [retyped[name], relax.Tuple(fields), *new.args[2:]], new.attrs, new.ty_args)

    functions = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            functions[gv] = Repacker(mod).visit_expr(func)
        else:
            functions[retyped.get(gv.name_hint, gv)] = func
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _calls_in(func: relax.Function) -> list[relax.Binding]:
    return [b for blk in func.body.blocks for b in blk.bindings if is_call_tir(b)]


def _tag_nodes(mod: tvm.IRModule) -> tvm.IRModule:
    block = main_block(mod)
    index = {b.value: i for i, b in enumerate(block.node_bindings)}

    @relax.expr_functor.mutator
    class Tagger(relax.PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            new = super().visit_call_(call)
            if call not in index:
                return new
            i = index[call]
            prim = mod[call.args[0]].with_attr(_TAG, i)
            gv = self.builder_.add_func(prim, f"{call.args[0].name_hint}_n{i}")
            return relax.Call(new.op, [gv, *new.args[1:]], new.attrs, new.ty_args)

    tagger = Tagger(mod)
    new_main = tagger.visit_expr(mod["main"])
    tagger.builder_.update_func(mod.get_global_var("main"), new_main)
    return tagger.builder_.get()


WEIGHT_PREFIX = "__autofuse_weight_"


@relax.expr_functor.mutator
class _WeightDetacher(relax.PyExprMutator):  # type: ignore[misc]
    """Each tensor constant of a function (not scalars) becomes a parameter, its value kept apart."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.params: list[relax.Var] = []
        self.values: list[tvm.runtime.Tensor] = []
        self._seen: dict[relax.Expr, relax.Var] = {}  # one parameter per constant (by identity)

    def visit_generic_const_(self, op: relax.Expr) -> relax.Expr:  # noqa: N802 (TVM's name)
        if len(op.value.shape) == 0:
            return op
        if op not in self._seen:
            self._seen[op] = relax.Var(f"{WEIGHT_PREFIX}{len(self.params)}", op.ty)
            self.params.append(self._seen[op])
            self.values.append(op.value)
        return self._seen[op]


def detach_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, dict[str, tvm.runtime.Tensor]]:
    """`mod` with main's tensor constants turned into extra parameters of main, and their values
    by parameter name; `attach_weights` binds them back. The measurement worker loads the
    workload from disk in every decision round: as TVM's JSON, weights are text (BERT-base: 586 MB,
    7.7 s to load, 9.2 s to save); apart, in TVM's binary parameter format, 1 MB of JSON and 2.3 s
    to load and bind."""
    gv = mod.get_global_var("main")
    fn = mod[gv]
    detacher = _WeightDetacher(mod)
    body = detacher.visit_expr(fn.body)
    if not detacher.params:
        return mod, {}
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out[gv] = relax.Function(list(fn.params) + detacher.params, body, None, fn.is_pure, fn.attrs)
    return out, {v.name: t for v, t in zip(detacher.params, detacher.values)}


def attach_weights(mod: tvm.IRModule, weights: dict[str, tvm.runtime.Tensor]) -> tvm.IRModule:
    """The module `detach_weights` took apart, whole again (structurally equal to the original)."""
    return relax.transform.BindParams("main", weights)(mod) if weights else mod
