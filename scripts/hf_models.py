"""The `transformers` architectures of the benchmark suite, from small configs with random weights.

Shared by scripts/benchmark.py (CPU, exported to ONNX) and scripts/gpu_torch_baselines.py (the
PyTorch baselines on the GPU host): one definition of each model. Needs torch and transformers,
nothing from autofuse.
"""

from __future__ import annotations

from typing import Any

REAL = ["bert", "gpt2", "vit", "resnet", "mobilenetv2"]


def torch_model(name: str) -> tuple[Any, tuple[Any, ...], list[str]]:
    """A transformers model from a small config (random weights) and its example input."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    ids = (torch.randint(0, 1000, (1, 32)),)
    image32, image64 = (torch.randn(1, 3, 32, 32),), (torch.randn(1, 3, 64, 64),)
    small_tf = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512)
    table = {
        "bert": (lambda: tf.BertModel(tf.BertConfig(vocab_size=1000, **small_tf)), ids, ["input_ids"]),
        "gpt2": (lambda: tf.GPT2Model(tf.GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=1000,
                                                     n_positions=64, bos_token_id=0, eos_token_id=0)),
                 ids, ["input_ids"]),
        "vit": (lambda: tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **small_tf)), image32,
                ["pixel_values"]),
        "resnet": (lambda: tf.ResNetModel(tf.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256],
                                                           depths=[1, 1, 1, 1])), image64, ["pixel_values"]),
        "mobilenetv2": (lambda: tf.MobileNetV2Model(tf.MobileNetV2Config(image_size=64, depth_multiplier=0.5)),
                        image64, ["pixel_values"]),
    }
    make, args, names = table[name]

    class LastHidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(x).last_hidden_state

    return LastHidden(make()).eval(), args, names
