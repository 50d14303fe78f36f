"""A deployment variant of an ONNX model, as published models come: half precision, dynamic
int8, or optimised for onnxruntime (its com.microsoft operators).

How the README's variant models were made (the suite's BERT, `scripts/benchmark.py --models
bert --export-only`), so that their import and timing can be checked again
(`python scripts/zoo_check.py --one VARIANT.onnx`):

    python scripts/model_variant.py bert.onnx bert_f16io32.onnx --kind float16-keep-io
    python scripts/model_variant.py bert.onnx bert_f16.onnx --kind float16
    python scripts/model_variant.py bert.onnx bert_dyn.onnx --kind dynamic-int8
    python scripts/model_variant.py bert.onnx bert_ortopt.onnx --kind ort-optimized

float16 uses onnxconverter-common (the `bench` extra): `keep-io` keeps float32 inputs and
outputs with the casts inside, as its `keep_io_types`. dynamic-int8 is onnxruntime's
`quantize_dynamic` (MatMulInteger and DynamicQuantizeLinear). ort-optimized is
`onnxruntime.transformers.optimizer` for a BERT-like model at opt_level 1 (SkipLayerNormalization,
Attention, ... where its patterns match).
"""

import argparse
from pathlib import Path

import onnx

KINDS = ("float16", "float16-keep-io", "dynamic-int8", "ort-optimized")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--kind", choices=KINDS, required=True)
    args = ap.parse_args()
    if args.kind.startswith("float16"):
        from onnxconverter_common import float16

        model = float16.convert_float_to_float16(onnx.load(str(args.model)), keep_io_types=args.kind.endswith("keep-io"))
        onnx.save(model, str(args.out))
    elif args.kind == "dynamic-int8":
        from onnxruntime.quantization import QuantType
        from onnxruntime.quantization import quantize_dynamic

        quantize_dynamic(str(args.model), str(args.out), weight_type=QuantType.QInt8)
    else:
        from onnxruntime.transformers import optimizer

        optimizer.optimize_model(str(args.model), model_type="bert", num_heads=0, hidden_size=0,
                                 opt_level=1).save_model_to_file(str(args.out))
    ops = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in onnx.load(str(args.out)).graph.node})
    print(f"wrote {args.out}: {', '.join(ops)}")


if __name__ == "__main__":
    main()
