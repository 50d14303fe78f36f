"""Export one of torchvision's detectors to ONNX as the journal's detector figures were made:
random weights (`torch.manual_seed(0)`, no download), one random square image, TorchScript's
exporter at opset 17.

Needs torch and torchvision, which autofuse does not install (the journal's exports: torch 2.14.1
and torchvision 0.29.1 in a venv of their own, `pip install torch==2.14.1 torchvision==0.29.1`):

    python scripts/export_detector.py keypointrcnn_resnet50_fpn OUT.onnx [--size 320]
        [--score-threshold 0.0 --detections 20]

With random weights no box scores above torchvision's threshold (0.05), so the post-processing
after the box head (Keypoint R-CNN's keypoint head, Mask R-CNN's mask head) runs on no detection;
`--score-threshold 0.0 --detections 20` keeps 20.
"""

import argparse


def main() -> None:
    import torch
    import torchvision

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a constructor of torchvision.models.detection (fasterrcnn_resnet50_fpn, ...)")
    ap.add_argument("out")
    ap.add_argument("--size", type=int, default=320, help="the image's side")
    ap.add_argument("--score-threshold", type=float, help="box_score_thresh (torchvision's default: 0.05)")
    ap.add_argument("--detections", type=int, help="box_detections_per_img (torchvision's default: 100)")
    args = ap.parse_args()
    options = {}
    if args.score_threshold is not None:
        options["box_score_thresh"] = args.score_threshold
    if args.detections is not None:
        options["box_detections_per_img"] = args.detections
    torch.manual_seed(0)
    model = getattr(torchvision.models.detection, args.name)(weights=None, weights_backbone=None, **options).eval()
    image = [torch.rand(3, args.size, args.size)]
    torch.onnx.export(model, (image,), args.out, opset_version=17, dynamo=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
