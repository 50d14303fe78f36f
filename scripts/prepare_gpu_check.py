"""Prepare everything the GPU host needs for `scripts/gpu_check.sh`, in one folder under 64 MiB.

    python scripts/prepare_gpu_check.py gpu_check            # CUDA sm_90 batches + runtime
    # copy gpu_check/ to the GPU host, there:  bash gpu_check/gpu_check.sh gpu_check results
    # back here, per model:  autofuse ingest gpu_check/batches/MODEL results/MODEL.json

The GPU host has Python 3.12 and no package index, so the folder carries a runtime-only copy of
TVM (the installed package without its 259 MB compiler library, sources and 3rd-party headers)
and the cp312 wheels it imports (apache-tvm-ffi, typing_extensions), unpacked. Batches: for each
model, unfused, TVM's default (DLight) and autofuse's candidates, compiled for the target, with
inputs and expected outputs (see autofuse/batch.py).
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from autofuse import models
from autofuse.batch import candidate_plans
from autofuse.batch import export_batch
from autofuse.build import MeasureConfig
from autofuse.measure import IsolatedMeasurer
from autofuse.space import SearchSpace
from autofuse.space import load_limits
from autofuse.space import load_resource_limits
from autofuse.tuning_log import TuningLog
from autofuse.workload import prepare

HERE = Path(__file__).parent
LIMIT_BYTES = 64 << 20
# what a runtime-only TVM does not need: the compiler library, sources, headers, the importers,
# the web runtime (tvm-ffi's core links libtvm_ffi_testing.so: it stays)
_DROP = ("libtvm_compiler.so", "3rdparty", "src", "include", "frontend", "web", "cython", "__pycache__", "*.pyc")


def runtime_copy(dest: Path, python: str = "3.12") -> None:
    """TVM's runtime-only package plus the packages it imports, for `python`, in `dest`:
    cp312 wheels of apache-tvm-ffi and typing_extensions unpacked, or with python="local" the
    ones installed here (how the test runs the copy)."""
    import tvm
    import tvm_ffi

    def ignore(_dir: str, names: list[str]) -> list[str]:
        return [n for n in names if _dropped(n)]

    shutil.copytree(Path(tvm.__file__).parent, dest / "tvm", ignore=ignore)
    if python == "local":
        import typing_extensions

        shutil.copytree(Path(tvm_ffi.__file__).parent, dest / "tvm_ffi", ignore=ignore)
        shutil.copy(typing_extensions.__file__, dest)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               python, "--platform", "manylinux_2_28_x86_64", "-d", tmp, f"apache-tvm-ffi=={tvm_ffi.__version__}",
               "typing_extensions"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(dest, [n for n in z.namelist() if not _dropped(n)])


def _dropped(member: str) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in member.split("/") for pattern in _DROP)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tree_bytes(root: Path, besides: Path) -> int:
    """The repository's files that travel with the folder `besides` (tracked, and untracked but
    not ignored, outside `besides`); 0 outside a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    files = [(root / name).resolve() for name in listed.split("\0") if name]
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_relative_to(besides.resolve()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="transformer_block,conv_block,mlp",
                    help="built-in model names or ONNX files")
    ap.add_argument("--plans", type=int, default=8, help="candidate plans per model")
    ap.add_argument("--target", default="cuda:sm_90")
    ap.add_argument("--space", default="gpu")
    ap.add_argument("--log-dir", type=Path, default=Path("tuning_logs"), help="logged plans join the candidates")
    ap.add_argument("--no-runtime", action="store_true", help="skip the TVM runtime copy (host has TVM)")
    ap.add_argument("--runtime-python", default="3.12",
                    help="the GPU host's Python version, or 'local': copy this machine's packages")
    ap.add_argument("--torch-models", default="", help="also time these hf_models on the GPU host (e.g. bert,gpt2)")
    args = ap.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    (args.out / "batches").mkdir(parents=True)
    _, limits = load_limits(args.space)
    resources = load_resource_limits(args.space)
    scheduler = "dlight" if args.target.startswith("cuda") else "rules"
    log = TuningLog(args.log_dir) if args.log_dir.exists() else None
    for name in args.models.split(","):
        source = Path(name) if Path(name).exists() else models.write_builtin(name, args.out / "models")
        w = prepare(source, [], target=args.target)
        plans = candidate_plans(w, SearchSpace(w.graph, limits), args.plans, args.target, log)
        with IsolatedMeasurer(w, target=args.target, config=MeasureConfig(timeout_s=600), limits=limits,
                              scheduler=scheduler, resource_limits=resources) as m:
            manifest = export_batch(m, plans, args.out / "batches" / w.name, scheduler,
                                    lambda label, status: print(f"  {w.name:<18} {label:<28} {status}", flush=True))
        print(f"{w.name}: {len(manifest['entries'])} plans, {len(manifest['rejected'])} rejected", flush=True)
    shutil.rmtree(args.out / "models", ignore_errors=True)
    for script in ("gpu_check.sh", "hf_models.py", "gpu_torch_baselines.py"):
        shutil.copy(HERE / script, args.out / script)
    if args.torch_models:
        (args.out / "torch_models.txt").write_text(args.torch_models)
    if not args.no_runtime:
        runtime_copy(args.out / "runtime", args.runtime_python)
    size, tree = folder_bytes(args.out), tree_bytes(HERE.parent, args.out)
    print(f"{args.out}: {size / 2**20:.1f} MiB (+ {tree / 2**20:.1f} MiB of the repository beside it)")
    if size + tree > LIMIT_BYTES:
        print(f"error: over the {LIMIT_BYTES >> 20} MiB upload limit; use fewer --plans or models", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
