"""Time a kernel over a shape no register tile or vector divides, with and without the rule
that handles it, as autofuse builds it (the normalised module; NCHW/NCW transposes included).

The figures of benchmarks/JOURNAL.md and the rules' came from this:
- channels: a 3x3 convolution whose output channels no vector width divides (255, 3), with and
  without tvm_bridge.WholeVectorChannels (channels padded to a multiple of 8, sliced back);
- frames: a 512 -> 512 1-D convolution (3 taps, stride 2) over output lengths no row tile
  divides (199, 1599), with and without tvm_bridge.WholeTileRows;
- transpose: [frames, 512] -> [512, frames] with and without schedule._transpose_tile's tiles;
- fivewide: a convolution into 40 or 200 channels (5 or 25 vectors of 8 lanes) with and without
  schedule._five_wide's tiles five vectors wide (AVX-512 hosts; 1 vector wide without);
- dilation: an atrous 3x3 convolution (DeepLabV3's ASPP: 960 -> 256 channels on 14x14, padding =
  dilation) with and without tvm_bridge.LiveTaps (taps that read only padding left out);
- apart: the same convolution with and without tvm_bridge.TapsApart (the sum of its taps, each
  computed over the outputs at which it reads the image);
- streamed: a kernel x 1 convolution (Inception's 7x1; `--kernel 3` a 3x3 one) on images whose
  pixels no row tile divides (17x17, 13x13), its weights streamed, with and without
  schedule._stream_tiles keeping such tiles out of parallel row groups;
- overlap: a convolution (`--kernel 1`: Xception's 1x1) from and into `--in-channels` channels on
  images whose pixels no row tile divides (37x37, 19x19), with and without
  schedule._overlap_last_tile (the last tile overlapping the one before it, not predicated).

    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py channels --sizes 255,256 --image 20
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py channels --sizes 1,2,3,8 --image 64
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py frames --sizes 199,200,1599
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py transpose --sizes 1599
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py fivewide --sizes 40 --image 28 --in-channels 40
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py fivewide --sizes 40 --image 28 --in-channels 240 --kernel 1
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py dilation --sizes 12,24,36 --image 14 --in-channels 960
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py apart --sizes 6,12 --image 14 --in-channels 960
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py streamed --sizes 17,16 --in-channels 192 --kernel 7
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py streamed --sizes 13 --in-channels 96 --kernel 3
    TVM_NUM_THREADS=2 python scripts/ragged_shapes.py overlap --sizes 37,19 --in-channels 728 --kernel 1
"""

import argparse

import numpy as np
import tvm
from tvm import relax

from autofuse import build
from autofuse import schedule
from autofuse import tvm_bridge


def conv2d(channels: int, image: int, c_in: int, kernel: int = 3) -> tuple[tvm.IRModule, tuple[int, ...]]:
    """NCHW input and OIHW weights, as an ONNX model imports; normalisation makes them NHWC."""
    w = np.random.default_rng(0).standard_normal((channels, c_in, kernel, kernel)).astype("float32")
    return _module((1, c_in, image, image), lambda x: relax.op.nn.conv2d(x, relax.const(w), padding=kernel // 2))


def tall(side: int, channels: int, kernel: int) -> tuple[tvm.IRModule, tuple[int, ...]]:
    """A kernel x 1 convolution, channels -> channels, on a side x side image (3 x 3 where kernel is 3)."""
    width = 3 if kernel == 3 else 1
    w = (np.random.default_rng(0).standard_normal((channels, channels, kernel, width)) * 0.05).astype("float32")
    return _module((1, channels, side, side),
                   lambda x: relax.op.nn.conv2d(x, relax.const(w), padding=(kernel // 2, width // 2)))


def atrous(dilation: int, image: int, c_in: int, channels: int = 256) -> tuple[tvm.IRModule, tuple[int, ...]]:
    w = np.random.default_rng(0).standard_normal((channels, c_in, 3, 3)).astype("float32")
    return _module((1, c_in, image, image),
                   lambda x: relax.op.nn.conv2d(x, relax.const(w), padding=dilation, dilation=dilation))


def conv1d(frames: int, channels: int) -> tuple[tvm.IRModule, tuple[int, ...]]:
    """Stride 2, 3 taps, no padding: `frames` output positions from 2 * frames + 1 inputs."""
    w = (np.random.default_rng(0).standard_normal((channels, channels, 3)) * 0.05).astype("float32")
    return _module((1, channels, 2 * frames + 1), lambda x: relax.op.nn.conv1d(x, relax.const(w), strides=2))


def transpose(frames: int, channels: int) -> tuple[tvm.IRModule, tuple[int, ...]]:
    return _module((1, frames, channels), lambda x: relax.op.permute_dims(x, [0, 2, 1]))


def _module(shape: tuple[int, ...], body) -> tuple[tvm.IRModule, tuple[int, ...]]:  # noqa: ANN001
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(x))
        bb.emit_func_output(out)
    return bb.get(), shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["channels", "frames", "transpose", "fivewide", "dilation", "apart", "streamed",
                                     "overlap"])
    ap.add_argument("--sizes", default="255,256", help="output channels, output frames, dilations, or image sides")
    ap.add_argument("--image", type=int, default=20, help="channels, fivewide: image height and width")
    ap.add_argument("--in-channels", type=int, default=None, help="default 64 (channels) or 512")
    ap.add_argument("--kernel", type=int, default=3, help="channels, fivewide: the convolution's kernel size")
    args = ap.parse_args()
    target, dev = build.make_target("llvm"), tvm.cpu()
    unchanged = tvm.transform.module_pass(lambda mod, _ctx: mod, opt_level=0, name="Unchanged")
    rule = {"channels": (tvm_bridge, "WholeVectorChannels", lambda: unchanged),
            "frames": (tvm_bridge, "WholeTileRows", lambda: unchanged),
            "transpose": (schedule, "_transpose_tile", lambda *_: None),
            "fivewide": (schedule, "_five_wide", lambda *_: ()),
            "dilation": (tvm_bridge, "LiveTaps", lambda: unchanged),
            "apart": (tvm_bridge, "TapsApart", lambda: unchanged),
            "streamed": (schedule, "_stream_tiles", None),
            "overlap": (schedule, "_overlap_last_tile", lambda func: func)}[args.case]
    original = getattr(rule[0], rule[1])
    if rule[2] is None:  # streamed: tiles split into row groups whether or not the last is partial
        rule = (*rule[:2], lambda *a: original(*a[:-1], False))
    config = build.MeasureConfig(repeat=9)
    for size in (int(s) for s in args.sizes.split(",")):
        if args.case in ("channels", "fivewide"):
            mod, shape = conv2d(size, args.image, args.in_channels or 64, args.kernel)
        elif args.case == "streamed":
            mod, shape = tall(size, args.in_channels or 192, args.kernel)
        elif args.case == "overlap":
            mod, shape = conv2d(args.in_channels or 512, size, args.in_channels or 512, args.kernel)
        elif args.case in ("dilation", "apart"):
            mod, shape = atrous(size, args.image, args.in_channels or 512)
        else:
            mod, shape = (conv1d if args.case == "frames" else transpose)(size, args.in_channels or 512)
        feed = np.random.default_rng(1).standard_normal(shape).astype("float32")
        times = {}
        for applied in (False, True):
            setattr(rule[0], rule[1], original if applied else rule[2])  # looked up at each use
            try:
                ex = build.build(tvm_bridge.normalize(mod), target)
            finally:
                setattr(rule[0], rule[1], original)
            times[applied] = np.median(build.time_latency(ex, dev, [feed], config)) * 1e6
        print(f"{args.case} {size:5d}: {times[False]:10.1f} us without the rule, {times[True]:10.1f} us with it")


if __name__ == "__main__":
    main()
