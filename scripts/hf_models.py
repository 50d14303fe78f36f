"""The `transformers` architectures of the benchmark suite, from small configs with random weights.

Shared by scripts/benchmark.py (CPU, exported to ONNX) and scripts/gpu_torch_baselines.py (the
PyTorch baselines on the GPU host): one definition of each model. Needs torch and transformers,
nothing from autofuse.
"""

from __future__ import annotations

from typing import Any

REAL = ["bert", "gpt2", "vit", "resnet", "mobilenetv2"]
# architectures the kernels and the search were not developed on: a check of the general case
# (`python scripts/benchmark.py --models unseen`)
UNSEEN = ["distilbert", "roberta", "albert", "t5_encoder", "deit", "swin", "convnext", "efficientnet", "regnet",
          "segformer", "whisper_encoder", "llama", "wav2vec2", "dinov2", "mobilevit", "deberta_v2", "clip_vision",
          "squeezebert", "mobilebert", "convbert", "bart", "phi", "bloom", "beit", "levit", "poolformer", "bit",
          "convnextv2", "ast", "mamba", "funnel", "cvt", "mobilenet_v1", "focalnet", "videomae", "yolos",
          "patchtst", "fnet", "swinv2", "gpt_neox", "xlnet", "wavlm", "dpt", "modernbert", "pvt_v2", "rwkv", "detr"]
# the stock configurations at deployment sizes (224x224 images, 128 tokens): the suite above uses
# small ones so that a run fits in an hour; these show where the kernels stand on real shapes
# (`python scripts/benchmark.py --models fullsize`)
FULLSIZE = ["bert_base", "resnet50", "mobilenetv2_224"]
# stock configurations of architectures outside the suite, at deployment sizes: the general case
# at real shapes (`python scripts/benchmark.py --models fullsize_unseen`)
FULLSIZE_UNSEEN = ["vit_base", "convnext_tiny", "swin_tiny", "distilbert_base", "gpt2_small", "wav2vec2_base"]


def torch_model(name: str) -> tuple[Any, tuple[Any, ...], list[str]]:
    """A transformers model from a small config (random weights) and its example input."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    ids = (torch.randint(0, 1000, (1, 32)),)
    image32, image64 = (torch.randn(1, 3, 32, 32),), (torch.randn(1, 3, 64, 64),)
    image224, ids128 = (torch.randn(1, 3, 224, 224),), (torch.randint(0, 1000, (1, 128)),)
    audio = (torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(1)),)  # leaves the seed's stream alone
    small_tf = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512)
    table = {
        "bert_base": (lambda: tf.BertModel(tf.BertConfig()), ids128, ["input_ids"]),
        "resnet50": (lambda: tf.ResNetModel(tf.ResNetConfig()), image224, ["pixel_values"]),
        "mobilenetv2_224": (lambda: tf.MobileNetV2Model(tf.MobileNetV2Config()), image224, ["pixel_values"]),
        "vit_base": (lambda: tf.ViTModel(tf.ViTConfig(), add_pooling_layer=False), image224, ["pixel_values"]),
        "convnext_tiny": (lambda: tf.ConvNextModel(tf.ConvNextConfig()), image224, ["pixel_values"]),
        "swin_tiny": (lambda: tf.SwinModel(tf.SwinConfig()), image224, ["pixel_values"]),
        "distilbert_base": (lambda: tf.DistilBertModel(tf.DistilBertConfig()), ids128, ["input_ids"]),
        "gpt2_small": (lambda: tf.GPT2Model(tf.GPT2Config()), ids128, ["input_ids"]),
        "wav2vec2_base": (lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config()), (torch.randn(1, 16000),), ["input_values"]),
        "bert": (lambda: tf.BertModel(tf.BertConfig(vocab_size=1000, **small_tf)), ids, ["input_ids"]),
        # deep and narrow: thousands of VM calls for little work a call (scripts/exec_mode_ab.py)
        **{f"bert_l{n}": (lambda n=n: tf.BertModel(tf.BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=n, num_attention_heads=4, intermediate_size=256)),
            ids, ["input_ids"]) for n in (24, 48)},
        "gpt2": (lambda: tf.GPT2Model(tf.GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=1000,
                                                     n_positions=64, bos_token_id=0, eos_token_id=0)),
                 ids, ["input_ids"]),
        "vit": (lambda: tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **small_tf)), image32,
                ["pixel_values"]),
        "resnet": (lambda: tf.ResNetModel(tf.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256],
                                                           depths=[1, 1, 1, 1])), image64, ["pixel_values"]),
        "mobilenetv2": (lambda: tf.MobileNetV2Model(tf.MobileNetV2Config(image_size=64, depth_multiplier=0.5)),
                        image64, ["pixel_values"]),
        "distilbert": (lambda: tf.DistilBertModel(tf.DistilBertConfig(vocab_size=1000, dim=128, n_layers=2, n_heads=4,
                                                                        hidden_dim=512)), ids, ["input_ids"]),
        "roberta": (lambda: tf.RobertaModel(tf.RobertaConfig(vocab_size=1000, max_position_embeddings=64, **small_tf)),
                    ids, ["input_ids"]),
        "albert": (lambda: tf.AlbertModel(tf.AlbertConfig(vocab_size=1000, embedding_size=64, **small_tf)), ids,
                   ["input_ids"]),
        "t5_encoder": (lambda: tf.T5EncoderModel(tf.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=256,
                                                              num_layers=2, num_heads=4)), ids, ["input_ids"]),
        "deit": (lambda: tf.DeiTModel(tf.DeiTConfig(image_size=32, patch_size=8, **small_tf)), image32,
                 ["pixel_values"]),
        "swin": (lambda: tf.SwinModel(tf.SwinConfig(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
                                                     num_heads=[2, 4], window_size=4)), image64, ["pixel_values"]),
        "convnext": (lambda: tf.ConvNextModel(tf.ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])),
                     image64, ["pixel_values"]),
        "efficientnet": (lambda: tf.EfficientNetModel(tf.EfficientNetConfig(image_size=64, width_coefficient=0.25,
                                                                             depth_coefficient=0.25, hidden_dim=320)),
                         image64, ["pixel_values"]),
        "regnet": (lambda: tf.RegNetModel(tf.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                                           depths=[1, 1, 1, 1], groups_width=8)), image64,
                   ["pixel_values"]),
        "segformer": (lambda: tf.SegformerModel(tf.SegformerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                                    num_attention_heads=[1, 1, 2, 2],
                                                                    decoder_hidden_size=64)), image64,
                      ["pixel_values"]),
        "whisper_encoder": (lambda: tf.WhisperModel(tf.WhisperConfig(
            vocab_size=1000, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=1,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
            max_source_positions=16, max_target_positions=32, pad_token_id=0, bos_token_id=0, eos_token_id=0,
            decoder_start_token_id=0)).get_encoder(), audio, ["input_features"]),
        "llama": (lambda: tf.LlamaModel(tf.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=344,
                                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                        max_position_embeddings=64)), ids, ["input_ids"]),
        "wav2vec2": (lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)), (torch.randn(1, 4000),), ["input_values"]),
        "dinov2": (lambda: tf.Dinov2Model(tf.Dinov2Config(image_size=56, patch_size=8, **small_tf)),
                   (torch.randn(1, 3, 56, 56),), ["pixel_values"]),
        "mobilevit": (lambda: tf.MobileViTModel(tf.MobileViTConfig(image_size=64, hidden_sizes=[48, 64, 80],
                                                                   neck_hidden_sizes=[8, 8, 16, 24, 32, 40, 160])),
                      image64, ["pixel_values"]),
        "deberta_v2": (lambda: tf.DebertaV2Model(tf.DebertaV2Config(vocab_size=1000, max_position_embeddings=64,
                                                                    **small_tf)), ids, ["input_ids"]),
        "clip_vision": (lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(image_size=64, patch_size=8, **small_tf)),
                        image64, ["pixel_values"]),
        "squeezebert": (lambda: tf.SqueezeBertModel(tf.SqueezeBertConfig(
            vocab_size=1000, embedding_size=128, max_position_embeddings=64, **small_tf)), ids, ["input_ids"]),
        "mobilebert": (lambda: tf.MobileBertModel(tf.MobileBertConfig(
            vocab_size=1000, hidden_size=128, embedding_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, intra_bottleneck_size=64, true_hidden_size=64, max_position_embeddings=64)),
            ids, ["input_ids"]),
        "convbert": (lambda: tf.ConvBertModel(tf.ConvBertConfig(vocab_size=1000, max_position_embeddings=64,
                                                                embedding_size=128, **small_tf)), ids, ["input_ids"]),
        "bart": (lambda: tf.BartModel(tf.BartConfig(
            vocab_size=1000, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64)),
            ids, ["input_ids"]),
        "phi": (lambda: tf.PhiModel(tf.PhiConfig(vocab_size=1000, hidden_size=128, intermediate_size=256,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  max_position_embeddings=64)), ids, ["input_ids"]),
        "bloom": (lambda: tf.BloomModel(tf.BloomConfig(vocab_size=1000, hidden_size=128, n_layer=2, n_head=4)),
                  ids, ["input_ids"]),
        "beit": (lambda: tf.BeitModel(tf.BeitConfig(image_size=32, patch_size=8, use_relative_position_bias=True,
                                                    **small_tf), add_pooling_layer=False), image32, ["pixel_values"]),
        "levit": (lambda: tf.LevitModel(tf.LevitConfig(image_size=64, hidden_sizes=[32, 64, 96], num_attention_heads=[1, 2, 3],
                                                       depths=[1, 1, 1], key_dim=[8, 8, 8])), image64, ["pixel_values"]),
        "poolformer": (lambda: tf.PoolFormerModel(tf.PoolFormerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])),
                       image64, ["pixel_values"]),
        "bit": (lambda: tf.BitModel(tf.BitConfig(embedding_size=64, hidden_sizes=[128, 256, 512, 1024], depths=[1, 1, 1, 1])),
                image64, ["pixel_values"]),
        "convnextv2": (lambda: tf.ConvNextV2Model(tf.ConvNextV2Config(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])),
                       image64, ["pixel_values"]),
        "ast": (lambda: tf.ASTModel(tf.ASTConfig(num_mel_bins=32, max_length=64, patch_size=16, frequency_stride=10,
                                                 time_stride=10, **small_tf)),
                (torch.randn(1, 64, 32),), ["input_values"]),
        "mamba": (lambda: tf.MambaModel(tf.MambaConfig(vocab_size=1000, hidden_size=64, state_size=8,
                                                       num_hidden_layers=2, expand=2, conv_kernel=4)), ids, ["input_ids"]),
        "funnel": (lambda: tf.FunnelBaseModel(tf.FunnelConfig(vocab_size=1000, block_sizes=[1, 1], d_model=128, n_head=4,
                                                              d_head=32, d_inner=256)), ids, ["input_ids"]),
        "cvt": (lambda: tf.CvtModel(tf.CvtConfig(embed_dim=[32, 64, 128], num_heads=[1, 2, 4], depth=[1, 2, 3])),
                image64, ["pixel_values"]),
        "mobilenet_v1": (lambda: tf.MobileNetV1Model(tf.MobileNetV1Config(image_size=64, depth_multiplier=0.5)),
                         image64, ["pixel_values"]),
        "focalnet": (lambda: tf.FocalNetModel(tf.FocalNetConfig(image_size=64, embed_dim=32, depths=[1, 1],
                                                                hidden_sizes=[32, 64])), image64, ["pixel_values"]),
        "videomae": (lambda: tf.VideoMAEModel(tf.VideoMAEConfig(image_size=32, patch_size=8, num_frames=4, tubelet_size=2,
                                                                **small_tf)),
                     (torch.randn(1, 4, 3, 32, 32),), ["pixel_values"]),
        "yolos": (lambda: tf.YolosModel(tf.YolosConfig(image_size=[64, 64], patch_size=8, num_detection_tokens=10,
                                                       **small_tf), add_pooling_layer=False), image64, ["pixel_values"]),
        "patchtst": (lambda: tf.PatchTSTModel(tf.PatchTSTConfig(num_input_channels=3, context_length=64, patch_length=8,
                                                                patch_stride=8, d_model=64, num_hidden_layers=2,
                                                                num_attention_heads=4, ffn_dim=128)),
                     (torch.randn(1, 64, 3),), ["past_values"]),
        "fnet": (lambda: tf.FNetModel(tf.FNetConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                    intermediate_size=512, max_position_embeddings=64)), ids, ["input_ids"]),
        "swinv2": (lambda: tf.Swinv2Model(tf.Swinv2Config(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
                                                          num_heads=[2, 4], window_size=4)), image64, ["pixel_values"]),
        "gpt_neox": (lambda: tf.GPTNeoXModel(tf.GPTNeoXConfig(vocab_size=1000, max_position_embeddings=64, rotary_pct=0.25,
                                                              **small_tf)), ids, ["input_ids"]),
        "xlnet": (lambda: tf.XLNetModel(tf.XLNetConfig(vocab_size=1000, d_model=128, n_layer=2, n_head=4, d_inner=512)),
                  ids, ["input_ids"]),
        "wavlm": (lambda: tf.WavLMModel(tf.WavLMConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)), (torch.randn(1, 4000),), ["input_values"]),
        "dpt": (lambda: tf.DPTForDepthEstimation(tf.DPTConfig(
            image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256,
            backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32,
            head_hidden_size=16)), image64, ["pixel_values"]),
        "modernbert": (lambda: tf.ModernBertModel(tf.ModernBertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                                      num_attention_heads=4, intermediate_size=256,
                                                                      global_attn_every_n_layers=2, local_attention=16,
                                                                      max_position_embeddings=64, pad_token_id=0,
                                                                      bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                                                      sep_token_id=2)), ids, ["input_ids"]),
        "pvt_v2": (lambda: tf.PvtV2Model(tf.PvtV2Config(image_size=64, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                        num_attention_heads=[1, 2, 4, 8])), image64, ["pixel_values"]),
        "rwkv": (lambda: tf.RwkvModel(tf.RwkvConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                                    attention_hidden_size=64, intermediate_size=256, context_length=64)),
                 ids, ["input_ids"]),
        "detr": (lambda: tf.DetrModel(tf.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False,
                                                    backbone_config=tf.ResNetConfig(embedding_size=16,
                                                                                    hidden_sizes=[16, 32, 64, 128],
                                                                                    depths=[1, 1, 1, 1],
                                                                                    out_features=["stage4"]),
                                                    d_model=64, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=128,
                                                    decoder_ffn_dim=128, encoder_attention_heads=4,
                                                    decoder_attention_heads=4, num_queries=10)),
                 image64, ["pixel_values"]),
    }
    make, args, names = table[name]

    class LastHidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            out = self.inner(x)  # a depth or detection head has no last_hidden_state: its first output
            return out.last_hidden_state if getattr(out, "last_hidden_state", None) is not None else out[0]

    return LastHidden(make()).eval(), args, names
