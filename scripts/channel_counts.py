"""Time a 3x3 convolution for several output-channel counts, with and without
tvm_bridge.WholeVectorChannels (output channels padded to a multiple of 8 and sliced back).

The README's and WholeVectorChannels' figures came from this: a count no vector width divides
(255, 3) fell back to one dot product per output without the padding.

    TVM_NUM_THREADS=2 python scripts/channel_counts.py --channels 255,256 --size 20
    TVM_NUM_THREADS=2 python scripts/channel_counts.py --channels 1,2,3,8 --size 64
"""

import argparse

import numpy as np
import tvm
from tvm import relax

from autofuse import build
from autofuse import tvm_bridge


def conv(channels: int, size: int, c_in: int) -> tvm.IRModule:
    """NCHW input and OIHW weights, as an ONNX model imports; normalisation makes them NHWC."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c_in, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((channels, c_in, 3, 3)).astype("float32"))
            out = bb.emit_output(relax.op.nn.conv2d(x, w, padding=1))
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", default="255,256")
    ap.add_argument("--size", type=int, default=20, help="image height and width")
    ap.add_argument("--in-channels", type=int, default=64)
    args = ap.parse_args()
    target, dev = build.make_target("llvm"), tvm.cpu()
    padding = tvm_bridge.WholeVectorChannels
    unchanged = tvm.transform.module_pass(lambda mod, _ctx: mod, opt_level=0, name="Unpadded")
    feed = np.random.default_rng(1).standard_normal((1, args.in_channels, args.size, args.size)).astype("float32")
    config = build.MeasureConfig(repeat=9)
    for channels in (int(c) for c in args.channels.split(",")):
        times = {}
        for padded in (False, True):
            tvm_bridge.WholeVectorChannels = padding if padded else (lambda: unchanged)  # normalize looks it up
            ex = build.build(tvm_bridge.normalize(conv(channels, args.size, args.in_channels)), target)
            times[padded] = np.median(build.time_latency(ex, dev, [feed], config)) * 1e6
        print(f"{channels:5d} output channels: {times[False]:10.1f} us as they are, {times[True]:10.1f} us padded")


if __name__ == "__main__":
    main()
