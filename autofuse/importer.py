"""Import a model into Relax: an ONNX file, a TVMScript file, or an IRModule given directly.

Real exported ONNX models often fail TVM's ONNX frontend because of shape-computing subgraphs,
so the model is first simplified with onnxslim under the user's fixed input shapes, and the
simplified model is checked against the original with onnxruntime before it is used.
Problems the user can fix (missing file, not ONNX, unfixed dynamic dimension, unsupported
operator) raise ModelError with a one-line message.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import runpy
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import tvm
from tvm import relax

from autofuse import onnx_attention
from autofuse import onnx_composites
from autofuse import onnx_constants
from autofuse import onnx_contrib
from autofuse import onnx_converters
from autofuse import onnx_corrections
from autofuse import onnx_deform_conv
from autofuse import onnx_dft
from autofuse import onnx_float16
from autofuse import onnx_integer
from autofuse import onnx_loop
from autofuse import onnx_loop_function
from autofuse import onnx_nms
from autofuse import onnx_qlinear
from autofuse import onnx_resize
from autofuse import onnx_rnn
from autofuse import onnx_sizes

DTYPES = {"float32", "float16", "int64", "int32", "int8", "uint8", "bool", "float64"}


class ModelError(ValueError):
    """A problem with the user's model or its input description (one line, no traceback)."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    # a value the input is fixed to: it becomes a constant of the model, no longer an input
    value: float | None = None

    @staticmethod
    def parse(text: str) -> InputSpec:
        """'name:1x3x224x224', 'name:1x3x224x224:float16' (a scalar is 'name:'), and with
        '=value' an input fixed to a value (a sample rate, a branch flag: 'sr::int64=16000').
        Read from the right: a name may hold colons (TorchScript's exporter names inputs
        'onnx::Gather_0')."""
        spec, eq, value_text = text.partition("=")
        parts = spec.split(":")
        typed = len(parts) >= 3 and not re.fullmatch(r"[\dx]*", parts[-1])  # name:shape:dtype
        name, shape_text = ":".join(parts[: -2 if typed else -1]), parts[-2 if typed else -1]
        if len(parts) < 2 or not name:
            raise ModelError(f"bad --input {text!r}; expected name:1x3x224x224[:dtype][=value]")
        try:
            shape = tuple(int(d) for d in shape_text.split("x")) if shape_text else ()
        except ValueError:
            raise ModelError(f"bad shape in --input {text!r}; dimensions are integers") from None
        if any(d <= 0 for d in shape):
            raise ModelError(f"bad shape in --input {text!r}; dimensions must be positive")
        dtype = parts[-1] if typed else "float32"
        if dtype not in DTYPES:
            raise ModelError(f"unknown dtype {dtype!r} in --input {text!r}; use one of {sorted(DTYPES)}")
        value = None
        if eq:
            try:
                value = float(value_text)
            except ValueError:
                raise ModelError(f"bad value in --input {text!r}; expected a number after '='") from None
        return InputSpec(name, shape, dtype, value)

    def __str__(self) -> str:
        value = "" if self.value is None else f"={self.value:g}"
        return f"{self.name}:{'x'.join(map(str, self.shape))}:{self.dtype}{value}"


@dataclass
class LoadedModel:
    """A model as imported, before normalisation; `onnx_model` is kept for reference runs."""

    mod: tvm.IRModule
    inputs: tuple[InputSpec, ...]
    source: str
    onnx_model: onnx.ModelProto | None = None
    notes: list[str] = field(default_factory=list)
    # the half-precision type the model declares but is imported to compute in float32 (CPU
    # targets, onnx_float16): reference runs of `onnx_model` carry its rounding
    upcast_from: str | None = None


def random_inputs(specs: Sequence[InputSpec], seed: int = 0) -> list[np.ndarray]:
    """Deterministic test inputs. Integer inputs stay in [0, 2), valid as ids and masks."""
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        if s.dtype.startswith("float"):
            out.append(rng.standard_normal(s.shape).astype(s.dtype))
        elif s.dtype == "bool":
            out.append(rng.integers(0, 2, s.shape).astype(bool))
        else:
            out.append(rng.integers(0, 2, s.shape).astype(s.dtype))
    return out


def load_model(
    source: str | Path | tvm.IRModule,
    inputs: Sequence[InputSpec] = (),
    simplify: bool = True,
    upcast_half: bool = False,
) -> LoadedModel:
    """Import `source`; `inputs` fix (or override) input shapes and dtypes by name.

    `upcast_half`: an ONNX model's float16/bfloat16 arithmetic is imported as float32, its
    interface kept (onnx_float16; for CPU targets, which have no half-precision arithmetic)."""
    if isinstance(source, tvm.IRModule):
        return LoadedModel(source, module_inputs(source, inputs), "<IRModule>")
    path = Path(source)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    if path.suffix == ".py":
        return _load_tvmscript(path, inputs)
    return _load_onnx(path, inputs, simplify, upcast_half)


def _load_tvmscript(path: Path, inputs: Sequence[InputSpec]) -> LoadedModel:
    try:
        namespace = runpy.run_path(str(path))
    except Exception as err:
        raise ModelError(f"{path}: TVMScript failed to load: {error_line(err)}") from None
    mods = [v for v in namespace.values() if isinstance(v, tvm.IRModule)]
    if not mods:
        raise ModelError(f"{path}: defines no IRModule (decorate a class with @I.ir_module)")
    mod = namespace.get("Module", mods[0])
    return LoadedModel(mod, module_inputs(mod, inputs), str(path))


def module_inputs(mod: tvm.IRModule, given: Sequence[InputSpec]) -> tuple[InputSpec, ...]:
    from tvm import relax

    names = [gv.name_hint for gv in mod.get_global_vars()]
    if "main" not in names:
        raise ModelError("the module has no 'main' Relax function")
    func = mod["main"]
    if not isinstance(func, relax.Function):
        raise ModelError("'main' is not a Relax function")
    specs = []
    for p in func.params:
        ty = p.ty
        values = getattr(getattr(ty, "shape", None), "values", None)
        try:
            shape = tuple(int(v) for v in values) if values is not None else None
        except TypeError:
            shape = None
        if shape is None:
            raise ModelError(f"input {p.name!r} has a symbolic shape ({ty}); give a static module")
        specs.append(InputSpec(p.name, shape, str(ty.dtype)))
    if given:
        valued = [s.name for s in given if s.value is not None]
        if valued:
            raise ModelError(f"input {valued[0]!r}: fixing an input's value (=value) is for ONNX models; "
                             "a Relax module can bind it itself (relax.transform.BindParams)")
        by_name = {s.name: s for s in given}
        if set(by_name) - {s.name for s in specs}:
            raise ModelError(f"unknown input(s) {sorted(set(by_name) - {s.name for s in specs})}")
        mismatched = [s for s in specs if s.name in by_name and by_name[s.name] != s]
        if mismatched:
            raise ModelError(f"a Relax module's shapes are fixed; {mismatched[0].name} is {mismatched[0]}")
    return tuple(specs)


def error_line(err: BaseException) -> str:
    """The line of an error worth one line of output: the last (TVM puts its message after the
    traceback), or the error's type where it has no text."""
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__


def _example_shape(dims: list) -> str:
    """A shape to give for dynamic dimensions: 1 for a leading (batch) one, the others by name
    for the user to choose (a YOLO's height and width suggested as 1 failed further on)."""

    def one(k: int, d: object) -> str:
        if isinstance(d, int) and d > 0:
            return str(d)
        return "1" if k == 0 else str(d).upper() if str(d).isidentifier() else f"D{k}"

    shape = "x".join(one(k, d) for k, d in enumerate(dims))
    return shape if all(p.isdigit() for p in shape.split("x")) else f"{shape}, the sizes to tune for"


def _onnx_inputs(model: onnx.ModelProto, given: Sequence[InputSpec]) -> tuple[InputSpec, ...]:
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    by_name = {s.name: s for s in given}
    unknown = set(by_name) - {i.name for i in graph_inputs}
    if unknown:
        known = [i.name for i in graph_inputs]
        raise ModelError(f"unknown input(s) {sorted(unknown)}; the model's inputs are {known}")
    specs = []
    for inp in graph_inputs:
        ttype = inp.type.tensor_type
        dtype = onnx_converters.element_dtype(ttype.elem_type)
        if inp.name in by_name:
            spec = by_name[inp.name]
            if len(spec.shape) != len(ttype.shape.dim):
                raise ModelError(
                    f"input {inp.name!r} has rank {len(ttype.shape.dim)}, --input gives {spec}"
                )
            specs.append(spec if spec.dtype == dtype else dataclasses.replace(spec, dtype=dtype))
            continue
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in ttype.shape.dim]
        dynamic = [d for d in dims if not isinstance(d, int) or d <= 0]
        if dynamic:
            raise ModelError(
                f"input {inp.name!r} has dynamic dimension(s) {dynamic}; "
                f"fix them with --input {inp.name}:{_example_shape(dims)}"
            )
        specs.append(InputSpec(inp.name, tuple(int(d) for d in dims), dtype))
    return tuple(specs)


def _refuse_run_time_branches(model: onnx.ModelProto, specs: Sequence[InputSpec]) -> None:
    """An If left after simplification whose condition reads graph inputs branches at run time;
    autofuse compiles one dataflow graph, so the user is told which inputs decide it (fixing
    them with --input name:shape:dtype=value folds the If into the branch taken)."""
    producer = {out: n for n in model.graph.node for out in n.output}
    by_name = {s.name: s for s in specs}
    for branch in (n for n in model.graph.node if n.op_type == "If"):
        seen, stack, deciding = set(), [branch.input[0]], []
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in by_name:
                deciding.append(by_name[name])
            elif name in producer and producer[name].op_type not in ("Shape", "Size"):
                stack.extend(producer[name].input)  # (shapes are fixed: not what decides)
        if deciding:
            example = " ".join(f"--input {s}=VALUE" for s in sorted(deciding, key=lambda s: s.name))
            raise ModelError(f"If node {branch.name or branch.output[0]!r} branches on input(s) "
                             f"{', '.join(sorted(s.name for s in deciding))} at run time; autofuse compiles one "
                             f"branch: fix the value with {example}")


def _fix_values(model: onnx.ModelProto, fixed: Sequence[InputSpec]) -> onnx.ModelProto:
    """The model with the `fixed` inputs as initializers holding their values. onnxslim then
    folds what they decide: an If on a sample rate (Silero VAD) or a cache flag becomes the
    branch taken, which TVM imports (it cannot import the If itself where a branch's shapes
    depend on the inputs)."""
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    names = {s.name: s for s in fixed}
    kept = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for s in fixed:
        array = np.full(s.shape, s.value).astype(s.dtype)
        model.graph.initializer.append(numpy_helper.from_array(array, s.name))
    return model


# operators TVM's frontend lacks, and stock converters corrected (onnx_resize, onnx_corrections)
_CONVERTERS = {**onnx_rnn.CONVERTERS, **onnx_dft.CONVERTERS, **onnx_attention.CONVERTERS,
               **onnx_composites.CONVERTERS, **onnx_contrib.CONVERTERS, **onnx_resize.CONVERTERS,
               **onnx_corrections.CONVERTERS, **onnx_nms.CONVERTERS, **onnx_deform_conv.CONVERTERS,
               **onnx_sizes.CONVERTERS, **onnx_loop_function.CONVERTERS}


@functools.cache
def _stock_ops() -> frozenset[str]:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return frozenset(_get_convert_map()) | {"Constant", "If"}


def _converts(node: onnx.NodeProto) -> bool:
    """Whether TVM's ONNX frontend, with autofuse's converters, has a converter for `node`."""
    if node.domain == onnx_contrib.DOMAIN:
        return f"{node.domain}.{node.op_type}" in _CONVERTERS
    return (node.op_type in _stock_ops() or node.op_type in _CONVERTERS) and node.domain in ("", "ai.onnx")


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """Nodes TVM's ONNX frontend has no converter for, as 'name (OpType, domain opset N)'."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    statistics = onnx_contrib.read_statistics(model)
    out = []
    for k, node in enumerate(model.graph.node):
        if k in statistics:
            out.append(f"{node.name or '<unnamed>'} ({node.op_type} whose mean/inv_std_var outputs are read)")
        elif not _converts(node):
            domain = node.domain or "ai.onnx"
            out.append(f"{node.name or '<unnamed>'} ({node.op_type}, {domain} opset {opsets.get(domain, '?')})")
    return out


def _load_onnx(path: Path, given: Sequence[InputSpec], simplify: bool, upcast_half: bool) -> LoadedModel:
    try:
        model = onnx.load(str(path))
        if not model.graph.node:
            raise ValueError("graph has no nodes")
    except Exception as err:
        raise ModelError(f"{path} is not a valid ONNX model: {error_line(err)}") from None
    specs = _onnx_inputs(model, given)
    notes: list[str] = []
    fixed = [s for s in specs if s.value is not None]
    if fixed:
        model = _fix_values(model, fixed)
        specs = tuple(s for s in specs if s.value is None)
        notes.append(f"input(s) {', '.join(str(s) for s in fixed)} fixed: constants of the model, no longer inputs")
    try:
        model, rewritten = onnx_qlinear.to_qdq(model)
    except onnx_qlinear.QLinearError as err:
        raise ModelError(f"{path}: {err}") from None
    if rewritten:
        notes.append(f"{rewritten} quantized operator(s) in QOperator form rewritten as QDQ (float between "
                     "DequantizeLinear and QuantizeLinear)")
    model, integer = onnx_integer.to_float(model)
    if integer:
        notes.append(f"{integer} integer operator(s) (ConvInteger, MatMulInteger) computed as float ones "
                     "on the same integers")
    model, unrolled = onnx_loop.unroll(model)
    if simplify:
        model = _simplify(model, specs, notes)
        # a count read from an input's shape (`range(x.shape[0])` exported with a dynamic
        # axis) is a constant once onnxslim has folded the fixed shapes
        model, more = onnx_loop.unroll(model)
        unrolled += more
    if unrolled:
        notes.append(f"{unrolled} Loop or Scan node(s) of a fixed length unrolled")
    looped = sum(n.op_type == "Loop" for n in model.graph.node)
    if looped:
        notes.append(f"{looped} Loop node(s) of a length known only at run time imported as recursive functions "
                     "(their kernels scheduled, not fused)")
    _refuse_run_time_branches(model, specs)
    four_bits = onnx_constants.reads_four_bits(model.graph)
    model, folded = onnx_constants.fold(model, lambda node: not _converts(node) or four_bits(node))
    if folded:
        notes.append(f"{folded} node(s) TVM has no converter or type for evaluated at import (constant inputs)")
    narrow = onnx_constants.narrow_values(model.graph)
    if narrow:
        raise ModelError(f"{path}: unsupported element type(s): {'; '.join(narrow[:3])} (float8, float4 and 2- or "
                         "4-bit values at run time; 4-bit constants a DequantizeLinear reads are dequantized at import)")
    missing = unsupported_ops(model)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelError(f"unsupported ONNX operator(s): {'; '.join(missing[:5])}{more}")
    model = _without_unread_inputs(model)
    unread = [s.name for s in specs if s.name not in {i.name for i in model.graph.input}]  # or dropped by onnxslim
    if unread:
        specs = tuple(s for s in specs if s.name not in unread)
        notes.append(f"input(s) {', '.join(unread)} read by no node (or only for a shape now fixed): left out, "
                     "the compiled model takes the others")
    imported, _ = onnx_contrib.tag(model)
    imported, _ = onnx_sizes.shapes_as_tensors(imported)
    imported, halves = onnx_float16.upcast(imported) if upcast_half else (imported, set())
    if halves:
        notes.append(f"{' and '.join(sorted(halves))} arithmetic computed in float32 (this CPU target has none; "
                     "inputs and outputs keep their types)")
    from tvm.relax.frontend.onnx import from_onnx

    try:
        with _relax_clip(), _static_index_extents(), onnx_converters.registered(_CONVERTERS):
            mod = from_onnx(
                imported,
                shape_dict={s.name: list(s.shape) for s in specs},
                dtype_dict={s.name: s.dtype for s in specs},
                keep_params_in_input=False,
            )
    except Exception as err:
        raise ModelError(f"{path}: TVM's ONNX frontend failed: {error_line(err)}") from None
    if not specs or _returns_a_shape(mod["main"].ret_ty):
        raise ModelError(f"{path}: no output is computed from the inputs' values once their shapes are fixed "
                         "(a constant or a shape): nothing to compile")
    upcast_from = min(halves) if halves else None
    return LoadedModel(mod, specs, str(path), model, notes, upcast_from)


def _returns_a_shape(ty: object) -> bool:
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return any(_returns_a_shape(f) for f in ty.fields)
    return isinstance(ty, relax.ShapeType)


def _without_unread_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without the graph inputs no node reads. TVM's frontend leaves
    them out of `main`'s parameters, so the inputs, fed in order, would no longer line up with
    them (a token_type_ids a model ignores; CastLike's target, read for its type; an input read
    only through Shape, folded once its shape is fixed; onnxslim drops such inputs itself)."""
    read = onnx_constants.names_read(model.graph) | {o.name for o in model.graph.output}
    if all(i.name in read for i in model.graph.input):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [i for i in out.graph.input if i.name in read]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    return out


@contextmanager
def _relax_clip():
    """TVM's ONNX frontend with Clip imported as Relax maximum/minimum ops instead of TIR.

    The stock converter emits Clip straight as TIR (`emit_te`), opaque to Relax passes: a ReLU6
    between two convolutions would stop the channels-last layout (tvm_bridge.normalize) from
    propagating and cost two transposes per activation. Same semantics, including ONNX's rule that
    a NaN bound means no bound (the stock bound sanitiser is kept).
    """
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    stock = fe.Clip

    class Clip(stock):  # type: ignore[misc, valid-type]
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            x = inputs[0]
            dtype = x.ty.dtype
            lo = relax.const(float(attr.get("min", -np.inf)), dtype)
            hi = relax.const(float(attr.get("max", np.inf)), dtype)
            return relax.op.minimum(bb.normalize(relax.op.maximum(x, lo)), hi)

        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            out = inputs[0]
            if len(inputs) > 1 and inputs[1] is not None:
                lo = cls._sanitize_nan_clip_bound(bb, inputs[1], for_min=True)
                out = bb.normalize(relax.op.maximum(out, lo))
            if len(inputs) > 2 and inputs[2] is not None:
                hi = cls._sanitize_nan_clip_bound(bb, inputs[2], for_min=False)
                out = bb.normalize(relax.op.minimum(out, hi))
            return out

    fe.Clip = Clip
    try:
        yield
    finally:
        fe.Clip = stock


class _AxisSize(NamedTuple):
    """The arguments of the frontend's `_axis_extent` (see _static_index_extents): the size a
    wrap of negative indices needs, read only where the indices are not constants."""

    bb: relax.BlockBuilder
    data: relax.Expr
    axis: int
    dtype: str


@contextmanager
def _static_index_extents():
    """TVM's ONNX frontend with constant gather indices wrapped at import.

    The stock Gather and GatherElements read the axis size at run time (shape_of ->
    shape_to_tensor -> take) and wrap negative indices as `where(i < 0, i + size, i)`, constant
    indices too (each `x[:, t]` of an unrolled scan). Those chains only became constants in
    FoldConstant, which legalises every op of the model to find them and builds each folded
    expression with LLVM: 36 of the 37 s Mamba took to normalise (1,282 builds). Shapes are
    static in autofuse, so constant indices are wrapped here, in numpy. The size is only read
    (the stock way) for run-time indices: their module, and its workload key, stay as they were.
    """
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    if not (hasattr(fe, "_axis_extent") and hasattr(fe, "_normalize_negative_indices")):
        yield  # a frontend without these helpers: its own conversion, slower to normalise
        return
    stock_extent, stock_wrap = fe._axis_extent, fe._normalize_negative_indices

    def wrap(bb, indices, axis_extent):
        if isinstance(axis_extent, _AxisSize):
            dims = onnx_converters.static_shape(axis_extent.data)
            size = dims[axis_extent.axis] if dims and -len(dims) <= axis_extent.axis < len(dims) else None
        else:  # another converter's size (OneHot's depth, GatherND's)
            size = axis_extent.value.numpy() if onnx_converters.is_const(axis_extent) else None
        if onnx_converters.is_const(indices) and size is not None:
            i = indices.value.numpy()
            return onnx_converters.array_const(np.where(i < 0, i + size, i).astype(i.dtype))
        if isinstance(axis_extent, _AxisSize):
            axis_extent = stock_extent(*axis_extent)
        return stock_wrap(bb, indices, axis_extent)

    fe._axis_extent = _AxisSize
    fe._normalize_negative_indices = wrap
    try:
        yield
    finally:
        fe._axis_extent, fe._normalize_negative_indices = stock_extent, stock_wrap


def _simplify(model: onnx.ModelProto, specs: Sequence[InputSpec], notes: list[str]) -> onnx.ModelProto:
    from autofuse.worker import compare

    shapes = [f"{s.name}:{','.join(map(str, s.shape))}" for s in specs]
    feeds, want = random_inputs(specs, seed=0), None
    # onnxslim 0.1.98's dead-node elimination broke Mask R-CNN (its masks output [1, 1, h, w]
    # instead of [20, 1, h, w]: the Loop pasting them); without onnxslim, sizes its constant
    # folding would have fixed reach TVM's frontend as run-time values it cannot import
    for skipped in ([], ["dead_node_elimination"]):
        try:
            slim = _slim_until_stable(model, shapes, skipped)
        except Exception as err:
            notes.append(f"onnxslim failed ({error_line(err)}); using the model as exported")
            return model
        try:
            want = run_onnxruntime(model, specs, feeds) if want is None else want
            got = run_onnxruntime(slim, specs, feeds)
        except Exception as err:
            notes.append(f"onnxruntime could not check the simplified model ({error_line(err)})")
            return slim
        ok, diff = compare(got, want)
        without = f" without its {', '.join(skipped)}" if skipped else ""
        if ok:
            notes.append(f"onnxslim{without}: {len(model.graph.node)} -> {len(slim.graph.node)} nodes, "
                         f"onnxruntime max abs diff {diff:.1e}")
            return slim
        notes.append(f"onnxslim{without} changed the outputs (max diff {diff:.2e})")
    notes.append("using the model as exported")
    return model


def _slim_until_stable(model: onnx.ModelProto, shapes: list[str], skipped: list[str],
                       calls: int = 10) -> onnx.ModelProto:
    """onnxslim again while a call removes nodes: one call stops after ten rounds of folding and
    shape inference (ONNXSLIM_MAX_ITER), and sizes read from a shape that only folding fixes take
    a round per link (timm's DaViT pads its window stages by sizes read from the last stage's
    shape: twelve rounds; Swin V2 five calls that remove nodes), while TVM's frontend cannot import a Pad by sizes
    left unfolded. A later call that fails keeps the last call's model."""
    import onnxslim

    slim = onnxslim.slim(model, input_shapes=shapes, model_check=False, skip_optimizations=skipped or None)
    for _ in range(calls - 1):
        try:
            again = onnxslim.slim(slim, input_shapes=shapes, model_check=False, skip_optimizations=skipped or None)
        except Exception:
            break
        if len(again.graph.node) >= len(slim.graph.node):
            break
        slim = again
    return slim


def onnxruntime_session(model: onnx.ModelProto | str, threads: int = 0):
    """An onnxruntime session of `model` (or of the ONNX file at that path): CPU provider, all
    graph optimisations, `threads` intra-op threads (0: onnxruntime's default). A model of more
    than protobuf's 2 GiB is handed over as a file with its weights beside it: it cannot be
    serialised as one message."""
    import tempfile

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    if isinstance(model, str):
        return ort.InferenceSession(model, opts, providers=providers)
    if model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
    with tempfile.TemporaryDirectory() as tmp:  # the session holds the weights once made
        return ort.InferenceSession(save_for_onnxruntime(model, tmp), opts, providers=providers)


def save_for_onnxruntime(model: onnx.ModelProto, directory: str) -> str:
    """`model` written to DIRECTORY/model.onnx (its weights beside it, so that a model over
    protobuf's 2 GiB limit saves too) for onnxruntime or a worker to load; the model itself is
    left as it was (saving with external data empties the tensors it writes out)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    path = str(Path(directory, "model.onnx"))
    onnx.save(copy, path, save_as_external_data=True)
    return path


def run_onnxruntime(
    model: onnx.ModelProto,
    specs: Sequence[InputSpec],
    feeds: Sequence[np.ndarray],
    threads: int = 0,
) -> list[np.ndarray]:
    """Run `model` with onnxruntime (see `onnxruntime_session`)."""
    sess = onnxruntime_session(model, threads)
    declared = {i.name for i in sess.get_inputs()}  # an input nothing reads may be gone (onnxslim)
    return list(sess.run(None, {s.name: x for s, x in zip(specs, feeds) if s.name in declared}))
