"""GPT-2 (``model_type: gpt2``): learned positions, pre-norm LayerNorm, GELU, fused QKV.

Hugging Face's GPT-2 already fuses queries, keys and values (``c_attn``) in tformer's row
order, but its ``Conv1D`` layers store weights as (in, out): every 2-D weight is transposed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tformer.config import ModelConfig
from tformer.interop.family import Family, differences, hf_field, require, special_token_ids, translated, width_mismatch
from tformer.interop.weight_map import ModuleMap

# HF ``activation_function`` <-> tformer activation.
ACTIVATIONS_FROM_HF = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
ACTIVATIONS_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}

# Variants of HF's GPT-2 that tformer does not implement, each with the one value it supports.
UNSUPPORTED_UNLESS = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}


def _conv1d(*theirs: str) -> ModuleMap:
    return ModuleMap(theirs, transposed=True)


class GPT2Family(Family):
    model_type = "gpt2"
    architecture_class = "GPT2LMHeadModel"
    base_prefix = "transformer."
    modules = {
        "embedding.token": ModuleMap(("transformer.wte",)),
        "stack.positional.absolute.embedding": ModuleMap(("transformer.wpe",)),
        "stack.blocks.{i}.attention_norm": ModuleMap(("transformer.h.{i}.ln_1",)),
        "stack.blocks.{i}.attention.qkv_proj": _conv1d("transformer.h.{i}.attn.c_attn"),
        "stack.blocks.{i}.attention.out_proj": _conv1d("transformer.h.{i}.attn.c_proj"),
        "stack.blocks.{i}.feedforward_norm": ModuleMap(("transformer.h.{i}.ln_2",)),
        "stack.blocks.{i}.feedforward.in_proj": _conv1d("transformer.h.{i}.mlp.c_fc"),
        "stack.blocks.{i}.feedforward.out_proj": _conv1d("transformer.h.{i}.mlp.c_proj"),
        "stack.final_norm": ModuleMap(("transformer.ln_f",)),
        "lm_head": ModuleMap(("lm_head",)),
    }
    # The causal-mask buffers that files written by older transformers versions carry.
    ignored_names = (r"\.attn\.bias$", r"\.attn\.masked_bias$")
    handled_fields = frozenset({
        "architecture", "vocab_size", "max_seq_len", "d_model", "num_layers", "num_heads", "num_kv_heads",
        "head_dim", "d_ff", "activation", "norm", "norm_position", "norm_eps", "positional", "dropout",
        "attention_dropout", "bias", "norm_bias", "attention_bias", "feedforward_bias", "tie_embeddings",
        "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id",
    })

    def config_from_hf(self, raw: Mapping[str, Any]) -> ModelConfig:
        for key, supported in UNSUPPORTED_UNLESS.items():
            require("gpt2", key, hf_field(raw, key, supported), supported)
        d_model = hf_field(raw, "n_embd", 768)
        special = special_token_ids("gpt2", raw, {"vocab_size": 50257, "bos_token_id": 50256, "eos_token_id": 50256})
        return ModelConfig(
            architecture="decoder",
            vocab_size=hf_field(raw, "vocab_size", 50257),
            max_seq_len=hf_field(raw, "n_positions", 1024),
            d_model=d_model,
            num_layers=hf_field(raw, "n_layer", 12),
            num_heads=hf_field(raw, "n_head", 12),
            d_ff=hf_field(raw, "n_inner", 4 * d_model),
            activation=translated(
                "gpt2", "activation_function", hf_field(raw, "activation_function", "gelu_new"), ACTIVATIONS_FROM_HF
            ),
            norm="layernorm",
            norm_position="pre",
            norm_eps=hf_field(raw, "layer_norm_epsilon", 1e-5),
            positional="learned",
            dropout=hf_field(raw, "resid_pdrop", 0.1),
            attention_dropout=hf_field(raw, "attn_pdrop", 0.1),
            bias=True,
            tie_embeddings=hf_field(raw, "tie_word_embeddings", True),
            initializer_range=hf_field(raw, "initializer_range", 0.02),
            **special,
        )

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]:
        return {
            "architectures": [self.architecture_class],
            "model_type": self.model_type,
            "vocab_size": config.vocab_size,
            "n_positions": config.max_seq_len,
            "n_embd": config.d_model,
            "n_layer": config.num_layers,
            "n_head": config.num_heads,
            "n_inner": config.d_ff,
            "activation_function": ACTIVATIONS_TO_HF[config.activation],
            "layer_norm_epsilon": config.norm_eps,
            "resid_pdrop": config.dropout,
            "embd_pdrop": config.dropout,
            "attn_pdrop": config.attention_dropout,
            "scale_attn_weights": True,
            "tie_word_embeddings": config.tie_embeddings,
            "initializer_range": config.initializer_range,
            "pad_token_id": config.pad_token_id,
            "bos_token_id": config.bos_token_id,
            "eos_token_id": config.eos_token_id,
        }

    def required_values(self, config: ModelConfig) -> list[str]:
        found = differences(config, {
            "architecture": "decoder",
            "positional": "learned",
            "norm": "layernorm",
            "norm_position": "pre",
            "activation": tuple(ACTIVATIONS_TO_HF),
            "num_kv_heads": config.num_heads,
            "head_dim": config.d_model // config.num_heads,
            "norm_bias": True,
            "attention_bias": True,
            "feedforward_bias": True,
        })
        found += width_mismatch(config)
        return found
