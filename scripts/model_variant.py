"""A deployment variant of an ONNX model, as published models come: half precision, dynamic
int8, optimised for onnxruntime (its com.microsoft operators), or a detector with its
non-maximum suppression inside.

How the variant models of benchmarks/JOURNAL.md were made (the suite's BERT, `scripts/benchmark.py --models
bert --export-only`), so that their import and timing can be checked again
(`python scripts/zoo_check.py --one VARIANT.onnx`):

    python scripts/model_variant.py bert.onnx bert_f16io32.onnx --kind float16-keep-io
    python scripts/model_variant.py bert.onnx bert_f16.onnx --kind float16
    python scripts/model_variant.py bert.onnx bert_dyn.onnx --kind dynamic-int8
    python scripts/model_variant.py bert.onnx bert_ortopt.onnx --kind ort-optimized
    python scripts/model_variant.py yolov8n.onnx yolov8n_nms.onnx --kind nms

float16 uses onnxconverter-common (the `bench` extra): `keep-io` keeps float32 inputs and
outputs with the casts inside, as its `keep_io_types`. dynamic-int8 is onnxruntime's
`quantize_dynamic` (MatMulInteger and DynamicQuantizeLinear). ort-optimized is
`onnxruntime.transformers.optimizer` for a BERT-like model at opt_level 1 (SkipLayerNormalization,
Attention, ... where its patterns match). nms takes a detector with one output laid out as
YOLOv8's, (1, 4 + classes, anchors) with boxes as centre and size, and appends what an
end-to-end export does: ONNX NonMaxSuppression (100 boxes a class, IoU 0.45, score 0.25) and
the gathers of the kept boxes, scores and classes, outputs whose length is known only at run
time.
"""

import argparse
from pathlib import Path

import onnx

KINDS = ("float16", "float16-keep-io", "dynamic-int8", "ort-optimized", "nms")


def with_nms(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, whose one output is (1, 4 + classes, anchors), followed by NonMaxSuppression:
    outputs boxes (kept, 4), scores (kept,) and classes (kept,)."""
    import numpy as np
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper

    graph = model.graph
    (raw,) = [o.name for o in graph.output]
    consts = {"nms_axis_rows": np.array([1], "int64"), "nms_0": np.array([0], "int64"),
              "nms_4": np.array([4], "int64"), "nms_end": np.array([1 << 30], "int64"),
              "nms_max": np.array([100], "int64"), "nms_iou": np.array([0.45], "float32"),
              "nms_score": np.array([0.25], "float32"), "nms_1": np.array(1, "int64"),
              "nms_2": np.array(2, "int64")}
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    graph.node.extend([
        helper.make_node("Slice", [raw, "nms_0", "nms_4", "nms_axis_rows"], ["nms_box_rows"]),
        helper.make_node("Transpose", ["nms_box_rows"], ["nms_boxes"], perm=[0, 2, 1]),
        helper.make_node("Slice", [raw, "nms_4", "nms_end", "nms_axis_rows"], ["nms_scores"]),
        helper.make_node("NonMaxSuppression", ["nms_boxes", "nms_scores", "nms_max", "nms_iou", "nms_score"],
                         ["nms_selected"], center_point_box=1),
        helper.make_node("Gather", ["nms_selected", "nms_2"], ["nms_anchor"], axis=1),
        helper.make_node("Gather", ["nms_selected", "nms_1"], ["classes"], axis=1),
        helper.make_node("Squeeze", ["nms_boxes", "nms_0"], ["nms_all_boxes"]),
        helper.make_node("Gather", ["nms_all_boxes", "nms_anchor"], ["boxes"], axis=0),
        helper.make_node("GatherND", ["nms_scores", "nms_selected"], ["scores"]),
    ])
    del graph.output[:]
    graph.output.extend([helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["kept", 4]),
                         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["kept"]),
                         helper.make_tensor_value_info("classes", TensorProto.INT64, ["kept"])])
    return model


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
    elif args.kind == "nms":
        onnx.save(with_nms(onnx.load(str(args.model))), str(args.out))
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
