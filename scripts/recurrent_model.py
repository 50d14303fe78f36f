"""A one-node ONNX recurrent model (LSTM, GRU or RNN) with random weights, to time the unrolled
recurrence alone (benchmarks/JOURNAL.md, 2026-12-07 late night):

    python scripts/recurrent_model.py LSTM 16 16 384 96 lstm16.onnx        # seq batch input hidden
    TVM_NUM_THREADS=2 python scripts/plan_vs_onnxruntime.py lstm16.onnx --repeat 21
    autofuse apply lstm16.onnx --log-dir EMPTY_DIR -o lstm16.so                # then library_ab.py 16x16x384

Bidirectional unless `--direction` says otherwise; time-major X [seq, batch, input], output Y.
"""

import argparse

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=sorted(GATES))
    ap.add_argument("seq", type=int)
    ap.add_argument("batch", type=int)
    ap.add_argument("input", type=int)
    ap.add_argument("hidden", type=int)
    ap.add_argument("out")
    ap.add_argument("--direction", default="bidirectional", choices=["forward", "reverse", "bidirectional"])
    args = ap.parse_args()
    g, d = GATES[args.op], 2 if args.direction == "bidirectional" else 1
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    inits = [weight("W", d, g * args.hidden, args.input), weight("R", d, g * args.hidden, args.hidden),
             weight("B", d, 2 * g * args.hidden)]
    node = helper.make_node(args.op, ["x", "W", "R", "B"], ["Y"], hidden_size=args.hidden, direction=args.direction)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [args.seq, args.batch, args.input])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [args.seq, d, args.batch, args.hidden])
    model = helper.make_model(helper.make_graph([node], "recurrent", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    onnx.save(model, args.out)


if __name__ == "__main__":
    main()
