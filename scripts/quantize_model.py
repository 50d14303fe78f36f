"""An int8 copy of an ONNX model with onnxruntime's static quantizer, in QOperator or QDQ form.

How the int8 models of benchmarks/JOURNAL.md were made (int8 ResNet-50: `--format qoperator --per-channel`):
onnxruntime's shape pre-processing, then `quantize_static` calibrated on a few random inputs
(autofuse.importer.random_inputs, seeds 0..N-1). Random calibration gives scales no real data
would, but the model's structure (QLinearConv, QGemm, ... or Q/DQ pairs) is what the importer
and the kernels see.

    python scripts/quantize_model.py MODEL.onnx MODEL_int8.onnx [--format qoperator|qdq]
        [--per-channel] [--samples 4] [--input name:1x3x224x224]
"""

import argparse
import tempfile
from pathlib import Path

import onnx
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization import quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from autofuse.importer import InputSpec
from autofuse.importer import _onnx_inputs
from autofuse.importer import random_inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--format", choices=["qoperator", "qdq"], default="qoperator")
    ap.add_argument("--per-channel", action="store_true")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--input", action="append", default=[], help="fix an input: name:1x3x224x224[:dtype]")
    args = ap.parse_args()
    specs = _onnx_inputs(onnx.load(str(args.model), load_external_data=False),
                         [InputSpec.parse(s) for s in args.input])
    feeds = iter([dict(zip((s.name for s in specs), random_inputs(specs, seed))) for seed in range(args.samples)])

    class Reader(CalibrationDataReader):
        def get_next(self):  # noqa: ANN201 - onnxruntime's interface
            return next(feeds, None)

    with tempfile.TemporaryDirectory() as tmp:
        pre = str(Path(tmp) / "pre.onnx")
        quant_pre_process(str(args.model), pre)
        quantize_static(pre, str(args.out), Reader(), per_channel=args.per_channel,
                        quant_format=QuantFormat.QOperator if args.format == "qoperator" else QuantFormat.QDQ)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
