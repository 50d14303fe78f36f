"""Measure an exported batch of compiled plans with the TVM runtime alone.

This file is self-contained on purpose: it needs Python, numpy and TVM's runtime (no compiler,
no relax, no autofuse), so it runs on a device host that has only those, or drives a device
through TVM's RPC. `autofuse export-batch` copies it into every batch directory:

    python runner.py BATCH_DIR --out results.json                 # on the device host
    python runner.py BATCH_DIR --out results.json --rpc HOST:PORT # through an RPC server
    python runner.py BATCH_DIR --out results.json --tracker HOST:PORT --key KEY

Each plan's library is loaded as a deployment would load it (the Relax VM's raw entry points),
run once and checked against the expected outputs in the batch. Then the plans that passed are
timed in turns, as autofuse times plans side by side: sample k of every plan back to back (each
sample the mean of `number` calls lasting at least `min_repeat_ms`), the order rotated, so that
the k-th samples share the device's state and pair up. Last, each new kernel is timed alone.
A plan that fails to load, crashes or gives wrong numbers is recorded as such and the batch goes
on. Results are written after every plan checked and every round of samples, so a run cut
short keeps what it measured (a plan checked but not timed yet reads "checked").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

import numpy as np

RESULTS_SCHEMA = 1
_DEVICE_TYPES = {"cpu": 1, "llvm": 1, "cuda": 2}  # DLDeviceType codes used by vm_initialization
_POOLED_ALLOCATOR = 2


def _session(args: argparse.Namespace):  # noqa: ANN202 - tvm types are not importable here statically
    """(tvm, remote session or None, device) for the batch's target."""
    import tvm

    kind = args.device
    if args.rpc or args.tracker:
        from tvm import rpc

        if args.rpc:
            host, port = args.rpc.rsplit(":", 1)
            remote = rpc.connect(host, int(port))
        else:
            host, port = args.tracker.rsplit(":", 1)
            remote = rpc.connect_tracker(host, int(port)).request(args.key, session_timeout=args.session_timeout)
        return tvm, remote, remote.device(_DEVICE_TYPES[kind], 0)
    return tvm, None, tvm.device(_DEVICE_TYPES[kind], 0)


def _load(tvm, remote, kind: str, path: str):  # noqa: ANN001, ANN202
    if remote is None:
        lib = tvm.runtime.load_module(path)
    else:
        remote.upload(path)
        lib = remote.load_module(os.path.basename(path))
    vm = lib["vm_load_executable"]()
    # plain device codes: over RPC, `dev.device_type` carries the session in its high bits
    device = (_DEVICE_TYPES[kind], 0, _POOLED_ALLOCATOR)
    host = (_DEVICE_TYPES["cpu"], 0, _POOLED_ALLOCATOR)
    vm["vm_initialization"](*device, *host)  # the device first, the CPU host last
    return lib, vm


def _flatten(out):  # noqa: ANN001, ANN202
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [a for item in out for a in _flatten(item)]


def _close(got: list[np.ndarray], want: list[np.ndarray], rtol: float, atol: float) -> tuple[bool, float]:
    # worker.compare's rule with the batch's tolerances, restated: this file may not import autofuse
    if len(got) != len(want):
        return False, float("inf")
    worst = 0.0
    ok = True
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False, float("inf")
        if g.size:
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
            finite = np.abs(w[np.isfinite(w)]) if w.dtype.kind == "f" else np.abs(w)
            scale = float(finite.max()) if finite.size else 0.0
            ok = ok and bool(np.allclose(g, w, rtol=rtol, atol=max(atol, rtol * scale), equal_nan=True))
    return ok, worst


def measure_batch(batch_dir: str, args: argparse.Namespace) -> dict:
    with open(os.path.join(batch_dir, "manifest.json")) as fh:
        manifest = json.load(fh)
    if args.device is None:  # the batch's target
        args.device = "cuda" if manifest["target"].startswith("cuda") else "cpu"
    tvm, remote, dev = _session(args)
    if not dev.exist:  # e.g. TVM's CUDA runtime found no libcudart: say so once, not per plan
        raise RuntimeError(f"no {args.device} device 0 visible to TVM's runtime"
                           + (" (is libcudart on the library path?)" if args.device == "cuda" else ""))
    feeds = [np.load(os.path.join(batch_dir, i["file"])) for i in manifest["inputs"]]
    want = [np.load(os.path.join(batch_dir, f)) for f in manifest.get("expected", [])]
    rtol, atol = manifest.get("tolerance", [1e-4, 1e-5])
    result = {
        "schema": RESULTS_SCHEMA,
        "batch": manifest["batch"],
        "model_key": manifest["model_key"],
        "target": manifest["target"],
        "device": args.device_name or _device_name(dev, args.device),
        "host": platform.node() if remote is None else (args.rpc or args.tracker),
        "runtime": os.path.dirname(tvm.__file__),
        "protocol": {"number": args.number, "repeat": args.repeat, "min_repeat_ms": args.min_repeat_ms,
                     "in_turns": True},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": [],
    }
    checked = []  # (row, lib, vm, tensors) of the plans that ran and matched
    for entry in manifest["entries"]:
        if args.only and entry["label"] not in args.only:
            continue
        row = {"plan_key": entry["plan_key"], "label": entry["label"]}
        t0 = time.perf_counter()
        try:
            lib, vm = _load(tvm, remote, args.device, os.path.join(batch_dir, entry["library"]))
            tensors = [tvm.runtime.tensor(x, dev) for x in feeds]
            got = _flatten(vm["main"](*tensors))
            ok, worst = _close(got, want, rtol, atol) if want else (True, 0.0)
            row["max_abs_err"] = worst
            if ok:
                row["status"] = "checked"
                checked.append((row, lib, vm, tensors))
            else:
                row.update(status="wrong_result", error=f"max abs diff {worst:.3g} vs expected")
        except Exception as err:  # one plan's failure is a result, not the end of the batch
            _failed(row, err, args)
        row["wall_s"] = time.perf_counter() - t0
        result["results"].append(row)
        _write(args.out, result)
        print(f"{entry['label']:<24} {row['status']:<14} {row.get('error', '')}", flush=True)
    _time_in_turns(dev, checked, args, lambda: _write(args.out, result))
    timed: set[str] = set()  # kernels shared by several plans are timed once
    entries = {e["plan_key"]: e for e in manifest["entries"]}
    for row, lib, _, _ in checked:
        if row["status"] == "ok":
            row["kernel_latencies_s"] = _time_kernels(tvm, lib, dev, entries[row["plan_key"]], timed, args)
        lat = row.get("latencies_s")
        shown = f"{sorted(lat)[len(lat) // 2] * 1e6:.1f} us" if lat else row.get("error", "")
        print(f"{row['label']:<24} {row['status']:<14} {shown}", flush=True)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write(args.out, result)
    return result


def _time_in_turns(dev, checked: list, args: argparse.Namespace, save) -> None:  # noqa: ANN001
    """`args.repeat` samples of every checked plan, sample k of each back to back, the order
    rotated (autofuse.build.time_interleaved's protocol, restated: this file may not import
    autofuse). A plan that fails while timed is out, with its error."""
    timers = {}
    for row, _, vm, _ in checked:
        try:
            timers[row["plan_key"]] = vm.time_evaluator("main", dev, number=args.number, repeat=1,
                                                        min_repeat_ms=args.min_repeat_ms)
        except Exception as err:
            _failed(row, err, args)
    live = [c for c in checked if c[0]["plan_key"] in timers]
    for r in range(args.repeat):
        for row, _, _, tensors in live[r % max(1, len(live)):] + live[: r % max(1, len(live))]:
            if row["status"] not in ("checked", "ok"):
                continue
            try:
                sample = float(timers[row["plan_key"]](*tensors).results[0])
            except Exception as err:
                _failed(row, err, args)
                row.pop("latencies_s", None)
                continue
            row.setdefault("latencies_s", []).append(sample)
            row["status"] = "ok"
        save()


def _failed(row: dict, err: Exception, args: argparse.Namespace) -> None:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    row.update(status="runtime_error", error=f"{type(err).__name__}: {lines[-1] if lines else ''}"[:500])
    if args.verbose:
        traceback.print_exc()


def _time_kernels(tvm, lib, dev, entry: dict, timed: set[str], args: argparse.Namespace) -> dict:  # noqa: ANN001
    """Each new kernel of the plan alone on random buffers (the cost model learns per kernel).
    Best effort: a kernel that cannot be timed this way is skipped, the plan's time stands."""
    out: dict[str, float] = {}
    names = entry.get("kernel_names") or {}
    rng = np.random.default_rng(0)
    try:
        host = lib.imports[0]
    except Exception:
        return out
    for key, params in (entry.get("kernel_params") or {}).items():
        if key in timed or key not in names:
            continue
        timed.add(key)
        try:
            bufs = []
            for shape, dtype in params:
                data = rng.standard_normal(shape) if "float" in dtype else np.zeros(shape)
                bufs.append(tvm.runtime.tensor(data.astype(dtype), dev))
            timer = host.time_evaluator(names[key], dev, number=args.number, repeat=max(3, args.repeat // 2),
                                        min_repeat_ms=args.min_repeat_ms)
            res = sorted(timer(*bufs).results)
            out[key] = float(res[len(res) // 2])
        except Exception:
            continue
    return out


def _device_name(dev, kind: str) -> str:  # noqa: ANN001
    if kind == "cpu":
        return f"cpu {platform.machine()}"
    try:
        return str(dev.device_name or kind)
    except Exception:
        return kind


def _write(path: str, result: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("batch_dir")
    ap.add_argument("--out", required=True, help="results JSON (rewritten after every plan)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: the batch's target)")
    ap.add_argument("--device-name", default="", help="recorded device name (default: queried)")
    ap.add_argument("--rpc", default="", help="HOST:PORT of a TVM RPC server")
    ap.add_argument("--tracker", default="", help="HOST:PORT of a TVM RPC tracker")
    ap.add_argument("--key", default="", help="device key at the tracker")
    ap.add_argument("--session-timeout", type=int, default=600)
    ap.add_argument("--number", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--min-repeat-ms", type=int, default=20)
    ap.add_argument("--only", nargs="*", default=[], help="labels to measure (default: all)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(args.batch_dir, "manifest.json")):
        print(f"runner: error: {args.batch_dir} has no manifest.json", file=sys.stderr)
        return 2
    try:
        measure_batch(args.batch_dir, args)
    except RuntimeError as err:
        print(f"runner: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
