"""Export models from outside the suites (Keras through tf2onnx, diffusers' U-Nets and VAE) to ONNX,
with random weights, for `plan_vs_onnxruntime.py` and `library_ab.py`.

Run it with an interpreter that has the exporter; nothing from autofuse is imported:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu tf2onnx
    /tmp/tfvenv/bin/python scripts/export_unseen.py keras Xception 299 /tmp/tf/Xception.onnx
    /tmp/tvenv/bin/pip install torch diffusers    # the timm sweep's venv (scripts/timm_sweep.py)
    /tmp/tvenv/bin/python scripts/export_unseen.py diffusers vae_decoder /tmp/df/vae_decoder.onnx

keras NAME SIDE: any `keras.applications` constructor (weights=None), batch 1, SIDE x SIDE x 3,
opset 17. diffusers NAME: `vae_decoder` (AutoencoderKL's decoder, 4 x 32 x 32 latents -> 256 x
256, GroupNorm in every block), `unet2d` (UNet2DModel on 64 x 64 with attention blocks) or
`unet_cond` (UNet2DConditionModel on 32 x 32 latents with cross-attention to 77 x 256), through
PyTorch's TorchScript exporter at opset 17 (GroupNorm as reshape + InstanceNormalization).
"""

from __future__ import annotations

import sys


def keras(name: str, side: int, out: str) -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf2onnx

    tf.random.set_seed(0)
    model = getattr(tf.keras.applications, name)(weights=None, input_shape=(side, side, 3))
    spec = (tf.TensorSpec((1, side, side, 3), tf.float32, name="input"),)

    @tf.function(input_signature=spec)
    def forward(x):  # noqa: ANN001, ANN202
        return model(x, training=False)

    # tf2onnx logs a failed transpose optimisation on some models (MobileNetV3's) and writes the
    # model without it
    tf2onnx.convert.from_function(forward, input_signature=spec, opset=17, output_path=out)


def diffusers(name: str, out: str) -> None:
    import torch
    from diffusers import AutoencoderKL
    from diffusers import UNet2DConditionModel
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    if name == "vae_decoder":
        model = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(64, 128, 128, 256),
                              down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                              layers_per_block=2, norm_num_groups=32)
        run, args, names = lambda m, z: m.decode(z).sample, (torch.randn(1, 4, 32, 32),), ["latent"]
    elif name == "unet2d":
        model = UNet2DModel(sample_size=64, in_channels=3, out_channels=3, block_out_channels=(64, 128, 128, 256),
                            down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                            up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
                            layers_per_block=2)
        run = lambda m, x, t: m(x, t).sample  # noqa: E731
        args, names = (torch.randn(1, 3, 64, 64), torch.tensor([10])), ["sample", "timestep"]
    elif name == "unet_cond":
        model = UNet2DConditionModel(sample_size=32, in_channels=4, out_channels=4, block_out_channels=(64, 128, 256),
                                     down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                                     up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
                                     layers_per_block=1, cross_attention_dim=256, attention_head_dim=8)
        run = lambda m, x, t, text: m(x, t, encoder_hidden_states=text).sample  # noqa: E731
        args = (torch.randn(1, 4, 32, 32), torch.tensor([10]), torch.randn(1, 77, 256))
        names = ["sample", "timestep", "text"]
    else:
        raise SystemExit(f"unknown diffusers model {name!r}")

    class Wrapped(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model  # its weights exported as the graph's initializers

        def forward(self, *xs):  # noqa: ANN002, ANN202
            return run(self.model, *xs)

    with torch.no_grad():
        torch.onnx.export(Wrapped(model.eval()), args, out, input_names=names, dynamo=False, opset_version=17)


if __name__ == "__main__":
    kind, rest = sys.argv[1], sys.argv[2:]
    if kind == "keras":
        keras(rest[0], int(rest[1]), rest[2])
    elif kind == "diffusers":
        diffusers(rest[0], rest[1])
    else:
        raise SystemExit(__doc__)
