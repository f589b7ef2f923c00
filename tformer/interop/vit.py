"""ViT (``model_type: vit``): Hugging Face's ViTModel (with its tanh pooler) and
ViTForImageClassification (a Linear on the final-normed class token) as tformer's VisionModel.

Weights are named as checkpoint files name them (``vit.encoder.layer.{i}.attention.attention.query``):
the Hub's files and what ``save_pretrained`` writes. transformers 5 renamed the modules in memory
(``vit.layers.{i}.attention.q_proj``); a file written with those names (``save_original_format=False``)
reads too. Hugging Face keeps ``query``/``key``/``value`` apart; tformer stacks them into ``qkv_proj``.
The class token and the position table keep HF's names and shapes (``cls_token`` (1, 1, D),
``position_embeddings`` (1, 1 + N, D)). ``encoder_stride`` (masked image modelling's) is not read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from tformer.checkpoint import CheckpointError
from tformer.config import ModelConfig
from tformer.interop.bert import ACTIVATIONS_FROM_HF, ACTIVATIONS_TO_HF, labels_from_hf, labels_to_hf
from tformer.interop.family import Family, differences, hf_field, require, translated, width_mismatch
from tformer.interop.weight_map import ModuleMap

# transformers 5's module names -> the names its files hold (applied in order).
RENAMED_IN_MEMORY = (
    (re.compile(r"\.layers\.(\d+)\."), r".encoder.layer.\1."),
    (re.compile(r"\.attention\.q_proj\."), ".attention.attention.query."),
    (re.compile(r"\.attention\.k_proj\."), ".attention.attention.key."),
    (re.compile(r"\.attention\.v_proj\."), ".attention.attention.value."),
    (re.compile(r"\.attention\.o_proj\."), ".attention.output.dense."),
    (re.compile(r"\.mlp\.fc1\."), ".intermediate.dense."),
    (re.compile(r"\.mlp\.fc2\."), ".output.dense."),
)
# The losses tformer's image classifier computes (HF picks mean squared error for one label).
PROBLEM_TYPES = (None, "single_label_classification")


class ViTFamily(Family):
    model_type = "vit"
    architecture = "vision"
    architecture_class = "ViTModel"
    base_prefix = "vit."
    heads: Mapping[str, str | None] = {
        "ViTModel": None,
        "ViTForImageClassification": "image_classification",
    }
    head_prefixes = ("vit.pooler.", "classifier.")
    tied_output_names = ()
    handled_fields = frozenset({
        "architecture", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff", "activation",
        "norm", "norm_position", "norm_eps", "positional", "dropout", "attention_dropout", "bias", "norm_bias",
        "attention_bias", "feedforward_bias", "embedding_norm", "initializer_range", "head", "num_labels",
        "label_names", "image_size", "patch_size", "num_channels", "pooling",
    })

    def module_map(self, config: ModelConfig) -> Mapping[str, ModuleMap]:
        p = self.base_prefix
        layer = p + "encoder.layer.{i}."
        return {
            "embedding": ModuleMap((p + "embeddings",)),  # cls_token, position_embeddings
            "embedding.patches.projection": ModuleMap((p + "embeddings.patch_embeddings.projection",)),
            "stack.blocks.{i}.attention.qkv_proj": ModuleMap(
                (layer + "attention.attention.query", layer + "attention.attention.key",
                 layer + "attention.attention.value"),
                fused="qkv",
            ),
            "stack.blocks.{i}.attention.out_proj": ModuleMap((layer + "attention.output.dense",)),
            "stack.blocks.{i}.attention_norm": ModuleMap((layer + "layernorm_before",)),
            "stack.blocks.{i}.feedforward.in_proj": ModuleMap((layer + "intermediate.dense",)),
            "stack.blocks.{i}.feedforward.out_proj": ModuleMap((layer + "output.dense",)),
            "stack.blocks.{i}.feedforward_norm": ModuleMap((layer + "layernorm_after",)),
            "stack.final_norm": ModuleMap((p + "layernorm",)),
            "pooler.dense": ModuleMap((p + "pooler.dense",)),
            "classifier": ModuleMap(("classifier",)),
        }

    def normalized_state(self, hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        """As the base class, with transformers 5's in-memory module names turned into the files' names."""
        state = super().normalized_state(hf_state, config)
        renamed = {}
        for name, tensor in state.items():
            for pattern, replacement in RENAMED_IN_MEMORY:
                name = pattern.sub(replacement, name)
            renamed[name] = tensor
        return renamed

    def saved_state(self, hf_state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
        """HF's layout: the bare ViTModel's tensors without the base prefix."""
        if config.head is None:
            return {name.removeprefix(self.base_prefix): tensor for name, tensor in hf_state.items()}
        return hf_state

    # ---- config ---------------------------------------------------------------------------

    def config_from_hf(self, raw: Mapping[str, Any]) -> ModelConfig:
        model_type = self.model_type
        d_model = hf_field(raw, "hidden_size", 768)
        num_heads = hf_field(raw, "num_attention_heads", 12)
        require(model_type, "qkv_bias", hf_field(raw, "qkv_bias", True), True)
        require(model_type, "pooler_act", hf_field(raw, "pooler_act", "tanh"), "tanh")
        require(model_type, "pooler_output_size", hf_field(raw, "pooler_output_size", d_model), d_model)
        if isinstance(d_model, int) and isinstance(num_heads, int) and num_heads > 0:
            require(model_type, "head_dim", hf_field(raw, "head_dim", d_model // num_heads), d_model // num_heads)
        head = self.head_from_hf(raw)
        labels = {}
        if head == "image_classification":
            problem_type = hf_field(raw, "problem_type", None)
            if problem_type not in PROBLEM_TYPES:
                raise CheckpointError(f"{model_type} problem_type={problem_type!r} is not supported by tformer "
                                      f"(supported: {', '.join(map(repr, PROBLEM_TYPES))}: cross-entropy)")
            labels = labels_from_hf(model_type, raw)
        return ModelConfig(
            architecture="vision",
            d_model=d_model,
            num_layers=hf_field(raw, "num_hidden_layers", 12),
            num_heads=num_heads,
            d_ff=hf_field(raw, "intermediate_size", 3072),
            activation=translated(model_type, "hidden_act", hf_field(raw, "hidden_act", "gelu"), ACTIVATIONS_FROM_HF),
            norm="layernorm",
            norm_position="pre",
            norm_eps=hf_field(raw, "layer_norm_eps", 1e-12),
            positional="learned",
            dropout=hf_field(raw, "hidden_dropout_prob", 0.0),
            attention_dropout=hf_field(raw, "attention_probs_dropout_prob", 0.0),
            bias=True,
            initializer_range=hf_field(raw, "initializer_range", 0.02),
            image_size=_square(model_type, "image_size", hf_field(raw, "image_size", 224)),
            patch_size=_square(model_type, "patch_size", hf_field(raw, "patch_size", 16)),
            num_channels=hf_field(raw, "num_channels", 3),
            pooling="cls",
            head=head,
            **labels,
        )

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        raw = {
            "architectures": [self.class_for_head(config.head)],
            "model_type": self.model_type,
            "hidden_size": config.d_model,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads,
            "intermediate_size": config.d_ff,
            "hidden_act": ACTIVATIONS_TO_HF[config.activation],
            "layer_norm_eps": config.norm_eps,
            "hidden_dropout_prob": config.dropout,
            "attention_probs_dropout_prob": config.attention_dropout,
            "initializer_range": config.initializer_range,
            "image_size": config.image_size,
            "patch_size": config.patch_size,
            "num_channels": config.num_channels,
            "qkv_bias": True,
            "encoder_stride": config.patch_size,
            "pooler_act": "tanh",
            "pooler_output_size": config.d_model,
        }
        if config.head == "image_classification":
            raw.update(labels_to_hf(config))
        return raw

    def required_values(self, config: ModelConfig) -> list[str]:
        found = differences(config, {
            "architecture": "vision",
            "positional": "learned",
            "norm": "layernorm",
            "norm_position": "pre",
            "embedding_norm": False,
            "activation": tuple(ACTIVATIONS_TO_HF),
            "num_kv_heads": config.num_heads,
            "head_dim": config.d_model // config.num_heads,
            "norm_bias": True,
            "attention_bias": True,
            "feedforward_bias": True,
            "pooling": "cls",
            "head": tuple(self.heads.values()),
        })
        found += width_mismatch(config)
        return found


def _square(model_type: str, key: str, value: Any) -> Any:
    """An image or patch size: an int, or a [height, width] pair of equal sides (tformer's are square)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise CheckpointError(f"{model_type} {key}={list(value)!r} is not supported by tformer (supported: "
                                  "square sizes, an int or [n, n])")
        return value[0]
    return value
