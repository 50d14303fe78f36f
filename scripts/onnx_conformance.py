"""Run ONNX's own operator conformance cases through autofuse's import and build.

Every node test of the installed `onnx` package (onnx.backend.test.case.node: a one-node model,
its inputs and the outputs the ONNX reference computes, about 1,900 cases) is imported as
`autofuse tune` imports a model (onnxslim, autofuse's converters, normalisation), built with
TVM's fusion plan and autofuse's CPU schedules, run, and compared with the expected outputs at
the case's own tolerances. Each chunk of cases runs in a child process, which TVM may abort: the
case it was on is recorded as `crash` and the next child resumes after it.

A case gives its operator's parameters (Resize's scales, Reshape's shape, Pad's pads, a
reduction's axes) as graph inputs; a model with fixed input shapes has them as constants once
onnxslim has folded it, which is what TVM's frontend expects. So integer inputs other than a
node's first (and a window's or Range's sizes, first or not), and the float parameters of
Resize/Upsample, become initializers here.

What it tells: which operators import and give the reference's numbers (`pass`), which are
refused up front (`unsupported`: a clear error, as it should be), and which import but compute
something else (`mismatch`) or fail later (`build_error`, `crash`) — the ones that matter.
Cases of training, string, random and sequence operators are skipped: no inference model
autofuse tunes computes them.

    python scripts/onnx_conformance.py --out /tmp/conformance.jsonl         # all, ~1 hour
    python scripts/onnx_conformance.py --ops Resize,Pad --out /tmp/c.jsonl  # some operators

tests/test_onnx_conformance.py runs it on the operators autofuse converts or corrects itself.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any


# operators no inference graph autofuse tunes computes: training, strings, randomness,
# sequences and optionals (TVM's Relax has no type for them)
SKIPPED_OPS = {
    "Adagrad", "Adam", "Momentum", "Gradient", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss",
    "StringConcat", "StringNormalizer", "StringSplit", "RegexFullMatch", "TfIdfVectorizer", "Bernoulli",
    "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
    "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement",
    "OptionalHasElement", "ImageDecoder", "Dropout", "AffineGrid",
}


def cases(ops: set[str] | None, expanded: bool = True) -> list[Any]:
    """The node test cases (of `ops` if given; `expanded`: with the cases of operators written
    out as their ONNX function bodies), skipped operators left out, in a stable order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case import node

        found = node.collect_testcases(None)
    out = []
    for c in sorted(found, key=lambda c: c.name):
        types = {n.op_type for n in c.model.graph.node}
        if types & SKIPPED_OPS or (ops and not types & ops) or (not expanded and "_expanded" in c.name):
            continue
        out.append(c)
    return out


HALF_ULP = {"bfloat16": 2.0**-7, "float16": 2.0**-10}

# float inputs past the first that are an operator's parameters, not data
FLOAT_PARAMETERS = {"Resize", "Upsample"}
# operators whose first input is a size too (a window's length, Range's start): their output
# shape is what it holds, so a model computing them has it as a constant
SIZE_OPERATORS = {"HannWindow", "HammingWindow", "BlackmanWindow", "Range", "ConstantOfShape", "MelWeightMatrix"}


def as_constants(model: Any, inputs: list[Any]) -> tuple[Any, list[Any]]:
    """(model, its remaining inputs) with the parameter inputs (see the module's docstring) made
    initializers holding the case's values."""
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    declared = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    values = dict(zip(declared, inputs))
    params = set()
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in values and (node.op_type in SIZE_OPERATORS or (k and (
                    values[name].dtype.kind in "iu" or node.op_type in FLOAT_PARAMETERS))):
                params.add(name)
    if not params:
        return model, inputs
    model = onnx.ModelProto.FromString(model.SerializeToString())
    keep = [i for i in model.graph.input if i.name not in params]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.graph.initializer.extend(numpy_helper.from_array(values[n], n) for n in sorted(params))
    return model, [values[n] for n in declared if n not in params]


def through_inputs(model: Any, expected: list[Any]) -> tuple[Any, list[Any]]:
    """A model with no inputs left (a window of a constant length: its outputs are constants,
    nothing to compile) with each numeric output passed through an Add of a zero input of its
    type and shape, as a model would use it, so that its values are still computed and checked.
    Returns (model, the zero inputs); the model itself where an output is not numeric."""
    import numpy as np
    import onnx
    from onnx import helper

    if any(e.dtype.kind not in "iuf" and "float" not in str(e.dtype) for e in expected):
        return model, []
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    names = [o.name for o in graph.output]
    inputs, outputs = [], []
    for name, e in zip(names, expected):
        dtype = helper.np_dtype_to_tensor_dtype(e.dtype)
        graph.node.append(helper.make_node("Add", [name, f"{name}__zero"], [f"{name}__out"]))
        inputs.append(helper.make_tensor_value_info(f"{name}__zero", dtype, list(e.shape)))
        outputs.append(helper.make_tensor_value_info(f"{name}__out", dtype, list(e.shape)))
    graph.input.extend(inputs)
    del graph.output[:]
    graph.output.extend(outputs)
    return model, [np.zeros(e.shape, e.dtype) for e in expected]


def run_case(case: Any, workdir: Path) -> dict[str, Any]:
    """Import, build with TVM's plan, run and compare one case."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from autofuse import apply
    from autofuse import build
    from autofuse.importer import InputSpec
    from autofuse.workload import prepare

    inputs, expected = case.data_sets[0]
    # numpy scalars and TensorProtos (4-bit and float8 values) are values too
    inputs, expected = ([numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else a for a in vals]
                        for vals in (inputs, expected))
    if any(not isinstance(a, (np.ndarray, np.generic)) for a in (*inputs, *expected)):
        return {"status": "skipped", "error": "sequence or optional values"}
    inputs, expected = [np.asarray(a) for a in inputs], [np.asarray(a) for a in expected]
    model, inputs = as_constants(case.model, list(inputs))
    if not inputs:
        model, inputs = through_inputs(model, expected)
    graph = model.graph
    declared = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    specs = [InputSpec(n, tuple(a.shape), str(a.dtype)) for n, a in zip(declared, inputs)]
    path = workdir / "model.onnx"
    onnx.save(model, path)
    try:
        w = prepare(path, specs)
    except Exception as err:
        text = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        status = "unsupported" if "unsupported ONNX operator" in text else "import_error"
        return {"status": status, "error": text[:300]}
    target = build.make_target("llvm")
    try:
        ex = build.build(apply.apply_plan(w.mod, w.graph, w.tvm_default()), target)
        feeds = [inputs[declared.index(s.name)] for s in w.inputs]
        got = build.run(ex, build.device_for(target), feeds)
    except Exception as err:
        return {"status": "build_error", "error": (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]}
    if len(got) != len(expected):
        return {"status": "mismatch", "error": f"{len(got)} outputs, expected {len(expected)}"}
    worst = 0.0
    for g, e in zip(got, expected):
        if g.shape != e.shape:
            return {"status": "mismatch", "error": f"shape {g.shape}, expected {e.shape}"}
        if e.dtype.kind in "biuU" or e.dtype == bool:
            if not np.array_equal(g.astype(e.dtype), e):
                return {"status": "mismatch", "error": f"{int((g.astype(e.dtype) != e).sum())} of {e.size} differ"}
            continue
        g64, e64 = g.astype("float64"), e.astype("float64")
        # half-precision outputs within one unit in their last place: the reference rounds every
        # intermediate to the type, autofuse computes in float32 on the CPU and rounds once
        ulp = HALF_ULP.get(str(e.dtype), 0.0)
        close = np.isclose(g64, e64, rtol=max(case.rtol, ulp), atol=max(case.atol, ulp), equal_nan=True)
        if not close.all():
            diff = np.abs(g64 - e64)[~close]
            return {"status": "mismatch", "error": f"{int((~close).sum())} of {e.size} beyond rtol {case.rtol} "
                                                    f"atol {case.atol}; max diff {np.nanmax(diff, initial=0):.3g}"}
        worst = max(worst, float(np.nanmax(np.abs(g64 - e64), initial=0)))
    return {"status": "pass", "max_diff": worst}


def child(names: list[str]) -> None:
    """Run the named cases in order, one JSON line each, flushed as it is done."""
    by_name = {c.name: c for c in cases(None)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            case = by_name[name]
            print(f"START {name}", flush=True)
            t0 = time.perf_counter()
            try:
                res = run_case(case, Path(tmp))
            except Exception as err:  # a fault of this script's own, not of the case
                res = {"status": "harness_error", "error": repr(err)[:300]}
            res |= {"case": name, "ops": sorted({n.op_type for n in case.model.graph.node}),
                    "s": round(time.perf_counter() - t0, 2)}
            print("RESULT " + json.dumps(res), flush=True)


def drive(names: list[str], out: Path, chunk: int, jobs: int = 1) -> list[dict[str, Any]]:
    """Run `names` in child processes, `chunk` at a time, `jobs` children at once; a child
    that dies marks its case `crash`."""
    done: dict[str, dict[str, Any]] = {}
    if out.exists():  # resume: cases already in the file are not run again
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done[r["case"]] = r
    todo = [n for n in names if n not in done]
    lock = threading.Lock()
    with out.open("a") as f:

        def record(r: dict[str, Any]) -> None:
            with lock:
                done[r["case"]] = r
                f.write(json.dumps(r) + "\n")
                f.flush()
                print(f"{len(done):5d} {r['status']:12s} {r['case']} {r.get('error', '')[:120]}", flush=True)

        def run(share: list[str]) -> None:
            while share:
                batch, share = share[:chunk], share[chunk:]
                proc = subprocess.Popen([sys.executable, __file__, "--child", ",".join(batch)],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env={**os.environ, "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", "1")})
                current = None
                for line in proc.stdout:  # type: ignore[union-attr]
                    if line.startswith("START "):
                        current = line.split()[1]
                    elif line.startswith("RESULT "):
                        record(json.loads(line[7:]))
                        current = None
                proc.wait()
                if current is not None:  # the child died inside a case: record it, go on after it
                    record({"case": current, "status": "crash", "error": f"process exited with {proc.returncode}"})
                    share = batch[batch.index(current) + 1:] + share

        threads = [threading.Thread(target=run, args=(todo[k::jobs],)) for k in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return [done[n] for n in names]


def summary(results: list[dict[str, Any]]) -> str:
    counts = collections.Counter(r["status"] for r in results)
    lines = [", ".join(f"{k} {v}" for k, v in counts.most_common())]
    for status in ("mismatch", "build_error", "crash", "import_error", "harness_error"):
        for r in results:
            if r["status"] == status:
                lines.append(f"{status:12s} {r['case']}: {r.get('error', '')[:160]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma list of operator types (default: all but the skipped kinds)")
    ap.add_argument("--out", type=Path, default=Path("conformance.jsonl"), help="JSON Lines, resumed if present")
    ap.add_argument("--no-expanded", action="store_true", help="leave out the cases of function-expanded graphs")
    ap.add_argument("--chunk", type=int, default=50, help="cases per child process")
    ap.add_argument("--jobs", type=int, default=1, help="child processes at once")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child.split(","))
        return
    ops = set(args.ops.split(",")) if args.ops else None
    names = [c.name for c in cases(ops, expanded=not args.no_expanded)]
    print(f"{len(names)} cases", flush=True)
    print(summary(drive(names, args.out, args.chunk, args.jobs)))


if __name__ == "__main__":
    main()
