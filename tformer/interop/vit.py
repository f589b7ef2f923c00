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
from tformer.interop.family import BERT_ENCODER_KEYS, CLASSIC_MHA_WITH_BIASES, Family, hf_field, require
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
    hf_keys = {
        **BERT_ENCODER_KEYS,
        "dropout": ("hidden_dropout_prob", 0.0),
        "attention_dropout": ("attention_probs_dropout_prob", 0.0),
        "image_size": ("image_size", 224),
        "patch_size": ("patch_size", 16),
        "num_channels": ("num_channels", 3),
    }
    layout = {"positional": "learned", "norm": "layernorm", "norm_position": "pre", "embedding_norm": False,
              "pooling": "cls"}
    requirements = CLASSIC_MHA_WITH_BIASES
    pinned = {"qkv_bias": True, "pooler_act": "tanh"}

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

    # ---- config ---------------------------------------------------------------------------

    def values_from_hf(self, raw: Mapping[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
        values = super().values_from_hf(raw, tokens)
        model_type = self.model_type
        d_model, num_heads = values["d_model"], values["num_heads"]
        require(model_type, "pooler_output_size", hf_field(raw, "pooler_output_size", d_model), d_model)
        if isinstance(d_model, int) and isinstance(num_heads, int) and num_heads > 0:
            require(model_type, "head_dim", hf_field(raw, "head_dim", d_model // num_heads), d_model // num_heads)
        for key in ("image_size", "patch_size"):
            values[key] = _square(model_type, key, values[key])
        problem_type = hf_field(raw, "problem_type", None)
        if values["head"] == "image_classification" and problem_type not in PROBLEM_TYPES:
            raise CheckpointError(f"{model_type} problem_type={problem_type!r} is not supported by tformer "
                                  f"(supported: {', '.join(map(repr, PROBLEM_TYPES))}: cross-entropy)")
        return values

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        return {**super().config_to_hf(config), "encoder_stride": config.patch_size,
                "pooler_output_size": config.d_model}


def _square(model_type: str, key: str, value: Any) -> Any:
    """An image or patch size: an int, or a [height, width] pair of equal sides (tformer's are square)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise CheckpointError(f"{model_type} {key}={list(value)!r} is not supported by tformer (supported: "
                                  "square sizes, an int or [n, n])")
        return value[0]
    return value
