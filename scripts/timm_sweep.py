"""Import robustness and speed on timm's architectures (random weights, none left at or near
zero: see FAINT): each model exported with PyTorch's TorchScript exporter (opset 17; or the
dynamo exporter where TorchScript's fails), then, each in a process of its own, TVM's plan
built, its output compared with onnxruntime's and both timed (`plan_vs_onnxruntime.py`). A
model that does not export is the exporter's problem: listed, not checked.

    pip install timm torch                      # in any environment: only the export needs them
    python scripts/timm_sweep.py --export-python /path/to/python-with-timm --out /tmp/timm
    python scripts/timm_sweep.py --models resnest14d,davit_tiny --out /tmp/timm

Writes OUT/RESULTS.md (one row per model: output difference, onnxruntime / TVM's plan).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# name[:image side] (224 unless given); window, hybrid and MLP-style models beside CNN families
# the torchvision sweep (zoo_check.py) has no member of
MODELS = ("convnext_atto efficientformer_l1 mobilevit_xxs:256 tiny_vit_5m_224 fastvit_t8:256 edgenext_xx_small:256 "
          "levit_128s ghostnet_100 repvgg_a0 sequencer2d_s gcvit_xxtiny pvt_v2_b0 crossvit_tiny_240:240 mvitv2_tiny "
          "davit_tiny focalnet_tiny_srf cait_xxs24_224 convit_tiny eva02_tiny_patch14_224 hiera_tiny_224 "
          "mobileone_s0 resnest14d skresnet18 botnet26t_256:256 lambda_resnet26t:256 coatnet_0_rw_224 "
          "pit_ti_224 tnt_s_patch16_224 mobilenetv4_conv_small hgnetv2_b0 efficientvit_b0 inception_next_tiny "
          "nextvit_small dla34 hrnet_w18_small xcit_nano_12_p16_224 poolformer_s12 res2net50_14w_8s "
          "visformer_tiny swinv2_cr_tiny_ns_224 rdnet_tiny halonet26t:256 volo_d1_224 "
          # added 2026-12-07: families none of the above belongs to
          "deit_tiny_patch16_224 resmlp_12_224 gmixer_12_224 dpn68 tf_efficientnetv2_b0 ghostnetv2_100 lcnet_050 "
          "ese_vovnet19b_dw selecsls42b rexnet_100 nf_regnet_b0 mobilevitv2_050:256 coat_lite_tiny "
          "maxvit_nano_rw_256:256 repghostnet_100 efficientformerv2_s0 starnet_s1 mambaout_femto regnetz_b16 "
          "ecaresnet26t sebotnet33ts_256:256 gcresnet33ts convnextv2_atto efficientvit_m0 poolformerv2_s12 "
          "inception_v3:299 twins_svt_small").split()

RECHECK_BELOW = 0.9  # onnxruntime / TVM's plan under which a model is timed a second time

# timm initialises some weights to zero or nearly (a classifier head, the last norm of each
# residual block, layer scales of 1e-5 or 1e-6; 31 of the models below): the branches behind them
# add (almost) nothing to the output, and comparing outputs checked nothing of them (Sequencer2D's
# head is zero: every output 0, its "max abs diff" 0). Such weights are drawn at random before
# the export, norm and layer scales around 1, others at the scale of their fan-in; biases at zero
# stay (they hide no computation)
FAINT = 1e-3

EXPORT = f"""
import sys, timm, torch
FAINT = {FAINT}
name, side, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
model, x = timm.create_model(name, pretrained=False).eval(), torch.randn(1, 3, side, side)
with torch.no_grad():
    for pname, p in model.named_parameters():  # see FAINT
        if not pname.endswith("bias") and p.numel() > 1 and float(p.abs().max()) < FAINT:
            p.copy_(torch.rand_like(p) + 0.5 if p.dim() == 1 else torch.randn_like(p) / p[0].numel() ** 0.5)
    try:
        torch.onnx.export(model, (x,), path, dynamo=False, input_names=["x"], opset_version=17)
    except Exception:
        torch.onnx.export(model, (x,), path, dynamo=True, input_names=["x"], opset_version=18)
"""


def export(python: str, name: str, side: int, path: Path) -> str | None:
    """None, or the export's last error line."""
    if path.exists():
        return None
    proc = subprocess.run([python, "-c", EXPORT, name, str(side), str(path)], capture_output=True, text=True)
    if proc.returncode == 0 and path.exists():
        return None
    lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "Exception" in ln] or [""]
    return lines[-1].strip()[:160]


def check(path: Path, timeout: int) -> tuple[str, float | None]:
    """A table row's cells from plan_vs_onnxruntime's output, and onnxruntime / TVM's plan."""
    script = Path(__file__).with_name("plan_vs_onnxruntime.py")
    try:
        proc = subprocess.run([sys.executable, str(script), str(path), "--repeat", "5"], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s | | |", None
    out = proc.stdout
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln] or [f"exit code {proc.returncode}"]
        return f"failed: {errors[-1].strip()[:160]} | | |", None
    diff = re.findall(r"max abs diff (\S+), (\S+) over 1e-3, largest \|output\| (\S+)", out)
    times = re.search(r"onnxruntime ([\d.]+) s .*TVM's plan ([\d.]+) s .*: onnxruntime / TVM's plan ([\d.]+)x", out)
    cells = "; ".join(f"{d} ({share}) of {largest}" for d, share, largest in diff)
    if not times:
        return f"{cells} | | |", None
    ort, tvm_s, ratio = times.groups()
    return f"{cells} | {float(ort) * 1e3:.1f} | {float(tvm_s) * 1e3:.1f} | {ratio}x", float(ratio)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of timm names[:image side]")
    ap.add_argument("--out", type=Path, default=Path("/tmp/timm"))
    ap.add_argument("--export-python", default=sys.executable, help="a Python with timm and torch")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model's check")
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = os.environ.get("TVM_NUM_THREADS") or str(os.cpu_count() or 1)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = ["| model | image | max abs diff (share of elements off by > 1e-3) of the largest output magnitude "
            "| onnxruntime ms | TVM's plan ms | onnxruntime / TVM's plan |", "|---|---|---|---|---|---|"]
    checked: dict[str, tuple[int, str, float | None]] = {}
    for spec in args.models.split(","):
        name, _, side_text = spec.partition(":")
        side = int(side_text or 224)
        path = args.out / f"{name}.onnx"
        error = export(args.export_python, name, side, path)
        checked[name] = (side, f"export failed: {error} | | |", None) if error else (side, *check(path, args.timeout))
        print(f"| {name} | {side} | {checked[name][1]} |", flush=True)
    for name, (side, cells, ratio) in checked.items():
        if ratio is not None and ratio < RECHECK_BELOW:  # once more, after the others: a slow spell of the
            again, ratio_again = check(args.out / f"{name}.onnx", args.timeout)  # host shows as a single slow row
            if ratio_again is not None:
                cells = f"{cells} (again: {ratio_again:.2f}x)"
        rows.append(f"| {name} | {side} | {cells} |")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (f"# timm architectures, TVM's plan against onnxruntime\n\nGenerated {stamp} by `python "
            f"scripts/timm_sweep.py {' '.join(sys.argv[1:])}` (TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}; "
            f"medians of 5 samples each, onnxruntime first; a model under {RECHECK_BELOW}x timed again after all "
            "the others, both shown).\n\n" + "\n".join(rows) + "\n")
    (args.out / "RESULTS.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
